"""Fixtures for the end-to-end language-server tests (helpers live in lsp_harness.py)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from lsp_harness import daemon_pids


@pytest.fixture
def runtime_dir() -> Any:
    """A short private runtime dir (Unix socket paths are limited to 107 bytes); daemons
    started in it are stopped at the end, by the pid in their lock file."""
    folder = Path(tempfile.mkdtemp(prefix="ks-"))
    yield folder
    for pid in daemon_pids(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def model_dir(random_llama_dir: Path) -> Path:
    """The small random llama model (tests/conftest.py) the servers load."""
    return random_llama_dir
