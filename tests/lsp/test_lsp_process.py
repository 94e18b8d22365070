"""The server process: TCP for debugging, and logs that keep document text out unless asked."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from lsp_harness import FAST, editor_session, server_command, server_env
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient, make_test_lsp_client

SECRET = "kspec_secret_identifier_4711"


async def test_tcp_on_loopback(model_dir: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *server_command("--tcp", "0", "--engine", "inprocess"), stderr=asyncio.subprocess.PIPE, env=server_env()
    )
    try:
        assert process.stderr is not None
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        match = re.search(r"listening on (127\.0\.0\.1):(\d+)", line)
        assert match, line  # a bare port means loopback
        client: LanguageClient = make_test_lsp_client()
        await client.start_tcp(match.group(1), int(match.group(2)))
        params = lsp.InitializeParams(capabilities=lsp.ClientCapabilities(), initialization_options={"model": str(model_dir), **FAST})
        result = await asyncio.wait_for(client.initialize_session(params), 60)
        assert result.capabilities.inline_completion_provider is not None
        await asyncio.wait_for(client.shutdown_session(), 30)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await client.stop()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_model_errors_and_logs(model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A model that cannot load is an error shown once (requests answer empty) until the
    setting is fixed; the log (at debug level) holds document text only with debugLog on."""
    missing = str(tmp_path / "no-such-model")
    async with editor_session({**FAST, "model": missing}, args=("--engine", "inprocess", "--log-level", "debug")) as editor:
        error = await editor.wait_status(lambda s: s["state"] == "error")
        assert missing in error["message"]
        uri = "file:///work/secret.py"
        editor.open(uri, f"{SECRET} = 1\nprint({SECRET}")
        assert await editor.inline(uri, 1, 6 + len(SECRET)) == []  # no engine: an empty answer, not an error
        assert await editor.inline(uri, 1, 6 + len(SECRET)) == []
        assert len(editor.messages(missing)) == 1  # shown once

        seen = len(editor.statuses)
        editor.configure({**FAST, "model": str(model_dir)})
        await editor.wait_status(lambda s: s["state"] == "ready", after=seen)
        editor.edit(uri, (1, 0), (1, 0), f"# {SECRET}\n")
        assert await editor.inline(uri, 2, 6 + len(SECRET))
        await editor.stats()
        quiet = capfd.readouterr().err
        assert "initialized: position encoding" in quiet  # the log is there, at debug level
        assert SECRET not in quiet

        editor.configure({**FAST, "model": str(model_dir), "debugLog": True})
        assert await editor.inline(uri, 2, 6 + len(SECRET))
        await editor.stats()
    assert SECRET in capfd.readouterr().err  # the user asked for it
