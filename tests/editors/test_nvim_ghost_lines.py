"""Headless Neovim: the ghost text leaves out what accepting replaces right of the cursor
(closing brackets already on screen), so `points[[` + `]]` never reads `points]]]]`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(os.environ.get("KSPEC_NVIM_PLUGIN") or REPO / "editors" / "nvim")

CASES = [  # (rest to insert, text right of the cursor it replaces) -> lines shown
    (("points]]", "]]"), ["points"]),
    (("x)", ")"), ["x"]),
    (("a,\n    b)", ")"), ["a,", "    b"]),
    (("value", ""), ["value"]),
    (("f(x)", "]"), ["f(x)"]),  # not what it replaces: shown whole
]


def test_ghost_lines_leave_out_the_brackets_already_right_of_the_cursor(nvim_bin: str, tmp_path: Path) -> None:
    script = tmp_path / "lines.lua"
    calls = ", ".join(f"require('kspec.ghost').display_lines({json.dumps(rest)}, {json.dumps(replaced)})" for (rest, replaced), _ in CASES)
    script.write_text(f"vim.opt.rtp:prepend({json.dumps(str(PLUGIN))})\nio.stdout:write(vim.json.encode({{ {calls} }}) .. '\\n')\n")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([nvim_bin, "--headless", "--clean", "-l", str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [lines for _, lines in CASES]
