"""The VS Code extension (editors/vscode): build from the lockfile, its node tests,
the .vsix package, and the protocol test against the real `kspec lsp`.

VS Code itself cannot run here; what these cover and what they do not is listed in
docs/editors-tested.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

VSCODE = Path(__file__).resolve().parents[2] / "editors" / "vscode"
NPM = shutil.which("npm")

pytestmark = pytest.mark.skipif(NPM is None, reason="npm is not installed (the extension is built and tested with node 20 + npm)")


def npm(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    assert NPM is not None
    result = subprocess.run(
        [NPM, *args], cwd=VSCODE, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    assert result.returncode == 0, f"npm {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-6000:]}"
    return result.stdout


def tap_counts(output: str) -> tuple[int, int]:
    passed = re.search(r"^# pass (\d+)$", output, re.M)
    failed = re.search(r"^# fail (\d+)$", output, re.M)
    assert passed and failed, output[-3000:]
    return int(passed.group(1)), int(failed.group(1))


@pytest.fixture(scope="module")
def built() -> Path:
    npm("ci", "--no-audit", "--no-fund", timeout=600)
    npm("run", "compile", timeout=300)
    assert (VSCODE / "out" / "src" / "extension.js").exists()
    return VSCODE


def test_node_unit_tests(built: Path):
    passed, failed = tap_counts(npm("test", timeout=120))
    assert failed == 0 and passed >= 30


def test_vsix_package(built: Path, tmp_path: Path):
    npm("run", "package", timeout=300)
    vsix = tmp_path / "kspec.vsix"
    shutil.move(VSCODE / "kspec.vsix", vsix)
    names = set(zipfile.ZipFile(vsix).namelist())
    for required in (
        "extension/package.json",
        "extension/out/src/extension.js",
        "extension/out/src/settings.js",
        "extension/node_modules/vscode-languageclient/package.json",
        "extension/LICENSE.txt",
    ):
        assert required in names, required
    assert not [n for n in names if n.startswith(("extension/src/", "extension/out/test/", "extension/test/"))]
    assert not [n for n in names if n.startswith("extension/node_modules/typescript/")], "dev dependencies packaged"


def test_protocol_against_kspec_lsp(built: Path, kspec_bin: Path, random_llama_dir: Path):
    env = {"KSPEC_TEST_MODEL": str(random_llama_dir), "KSPEC_TEST_ENGINE": "inprocess"}
    if kspec_bin != VSCODE.parents[1] / ".venv" / "bin" / "kspec":
        # not the repository's .venv, which the test finds the way the extension would
        env["KSPEC_LSP_COMMAND"] = json.dumps([str(kspec_bin), "lsp"])
    output = npm("run", "test:protocol", timeout=300, env=env)
    passed, failed = tap_counts(output)
    assert failed == 0 and passed == 13, output[-3000:]
