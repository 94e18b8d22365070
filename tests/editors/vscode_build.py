"""Building the VS Code extension (editors/vscode) with npm, for the tests that need it built or
packaged: its node tests, the .vsix checks, the protocol test and the code-server end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

VSCODE = Path(__file__).resolve().parents[2] / "editors" / "vscode"
NPM = shutil.which("npm")
NO_NPM = "npm is not installed (the extension is built and tested with node 20 + npm)"


def npm(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    assert NPM is not None, NO_NPM
    result = subprocess.run(
        [NPM, *args], cwd=VSCODE, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    assert result.returncode == 0, f"npm {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-6000:]}"
    return result.stdout


def build() -> Path:
    """npm ci + compile, from the lockfile; returns the extension's folder."""
    npm("ci", "--no-audit", "--no-fund", timeout=600)
    npm("run", "compile", timeout=300)
    assert (VSCODE / "out" / "src" / "extension.js").exists()
    return VSCODE


def package(into: Path) -> Path:
    """The .vsix of the built extension, moved into `into`."""
    npm("run", "package", timeout=300)
    vsix = into / "kspec.vsix"
    shutil.move(VSCODE / "kspec.vsix", vsix)
    return vsix
