"""The VS Code extension (editors/vscode): build from the lockfile, its node tests,
the .vsix package, and the protocol test against the real `kspec lsp`.

The extension in a real VS Code (code-server in Chromium): test_vscode_in_code_server.py."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest
from vscode_build import NPM, NO_NPM, VSCODE, npm, package

pytestmark = pytest.mark.skipif(NPM is None, reason=NO_NPM)


def tap_counts(output: str) -> tuple[int, int]:
    passed = re.search(r"^# pass (\d+)$", output, re.M)
    failed = re.search(r"^# fail (\d+)$", output, re.M)
    assert passed and failed, output[-3000:]
    return int(passed.group(1)), int(failed.group(1))


def test_node_unit_tests(built: Path):
    passed, failed = tap_counts(npm("test", timeout=120))
    assert failed == 0 and passed >= 30


def test_vsix_package(built: Path, tmp_path: Path):
    vsix = package(tmp_path)
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
