"""The shared engine daemon end to end: two editors, one daemon; killed mid-request, restarted once."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
from pathlib import Path

from lsp_harness import FAST, daemon_pids, editor_session

DAEMON = ("--engine", "daemon", "--engine-idle-timeout", "60")


async def test_two_editors_share_one_daemon_that_restarts_after_a_crash(model_dir: Path, runtime_dir: Path) -> None:
    options = {"model": str(model_dir), **FAST}
    async with editor_session(options, args=DAEMON, runtime_dir=runtime_dir) as first, editor_session(options, args=DAEMON, runtime_dir=runtime_dir) as second:
        pid = (await first.ready())["enginePid"]
        assert (await second.ready())["enginePid"] == pid  # the second editor found the running daemon
        assert daemon_pids(runtime_dir) == [pid]
        (socket,) = (runtime_dir / "kspec").glob("*.sock")
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600
        assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700

        uri = "file:///work/shared.py"
        for editor in (first, second):
            editor.open(uri, "def shared():\n    ")
            assert await editor.inline(uri, 1, 4)

        # Kill the daemon while it works on a long request of the first editor.
        first.configure({**FAST, "maxTokens": 256})
        before = await first.stats()
        seen = len(first.statuses)
        request = asyncio.ensure_future(first.inline(uri, 1, 4))
        deadline = asyncio.get_running_loop().time() + 30
        while (await first.stats())["engine_calls"] == before["engine_calls"]:
            assert asyncio.get_running_loop().time() < deadline
        os.kill(pid, signal.SIGKILL)
        assert await asyncio.wait_for(request, 30) == []  # an empty answer, not an error or a hang

        restarted = await first.wait_status(lambda s: s["state"] == "ready" and s.get("enginePid") not in (None, pid), after=seen)
        new_pid = restarted["enginePid"]
        first.configure(FAST)
        assert await first.inline(uri, 1, 4)
        assert len(first.messages("stopped unexpectedly")) == 1  # reported once
        await second.wait_status(lambda s: s["state"] == "ready" and s.get("enginePid") == new_pid, after=0)
        assert await second.inline(uri, 1, 4)
        assert daemon_pids(runtime_dir) == [new_pid]  # still one daemon for both editors


def test_the_daemon_runs_in_the_callers_environment_with_nothing_of_kspec_top_level(tmp_path: Path, monkeypatch) -> None:
    """The daemon gets the editor's environment as it is: no folder of kspec's on its PYTHONPATH,
    so `engine` or `kernels` never become top-level names in it."""
    import sys

    from kspec.engine.serve.runtime import DaemonPaths
    from kspec.lsp_server.engine_client import DaemonOptions, spawn_daemon

    monkeypatch.delenv("PYTHONPATH", raising=False)
    paths = DaemonPaths(tmp_path / "e.sock", tmp_path / "e.lock", tmp_path / "e.log")
    process = spawn_daemon(DaemonOptions(folder=tmp_path, idle_timeout_s=1.0), paths)
    try:
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{process.pid}/environ").read_text().split("\0") if "=" in item)
        assert "PYTHONPATH" not in environ
        probe = subprocess.run([sys.executable, "-c", "import engine"], env=environ, capture_output=True, text=True, cwd=tmp_path)
        assert probe.returncode != 0 and "No module named 'engine'" in probe.stderr
    finally:
        process.kill()
        process.wait()
