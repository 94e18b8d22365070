"""Headless Neovim 0.11 attaches `kspec lsp` with vim.lsp.start (its own LSP client, our
plugin absent) and gets a whole inline completion: no early answer, as it never re-asks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lsp_harness import REPO, server_env

NVIM = Path(sys.executable).parent / "nvim"
SCRIPT = Path(__file__).with_name("nvim_inline.lua")


def test_neovim_gets_an_inline_completion(model_dir: Path, tmp_path: Path) -> None:
    env = {**server_env(), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state")}
    version = subprocess.run([str(NVIM), "--version"], capture_output=True, text=True, timeout=30, env=env).stdout
    assert version.startswith("NVIM v0.11"), version
    command = [str(NVIM), "--headless", "--clean", "-l", str(SCRIPT), sys.executable, str(model_dir), str(tmp_path / "add.py")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no output; stderr: {done.stderr[-2000:]}"
    report = json.loads(lines[-1])
    assert "error" not in report, report
    assert report["encoding"] == "utf-8"  # Neovim 0.11 offers utf-8 first
    answer = report["answer"]
    assert answer and answer.get("err") is None, answer
    items = answer["result"]["items"]
    assert 1 <= len(items) <= 2
    for item in items:
        assert item["insertText"]
        assert item["range"]["start"] == {"line": 1, "character": 11}
    stats = report["stats"]
    assert stats["early_answers"] == 0 and stats["typeahead_hits"] == 1, stats  # an early answer would be a fragment
    assert report["again"]["result"]["items"] == items  # the typeahead cache serves it the same whole answer
