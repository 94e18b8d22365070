"""The server process: TCP for debugging, and logs that keep document text out unless asked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from lsp_harness import FAST, editor_session, tcp_server
from lsprotocol import types as lsp
from pytest_lsp import LanguageClient, make_test_lsp_client

SECRET = "kspec_secret_identifier_4711"


async def _tcp_server(runtime: Path) -> tuple[asyncio.subprocess.Process, str, int, str]:
    return await tcp_server(runtime, "--engine", "inprocess")


async def test_tcp_on_loopback(model_dir: Path, tmp_path: Path) -> None:
    process, host, port, token = await _tcp_server(tmp_path)
    try:
        client: LanguageClient = make_test_lsp_client()
        await client.start_tcp(host, port)
        options = {"model": str(model_dir), **FAST, "lspToken": token}
        params = lsp.InitializeParams(capabilities=lsp.ClientCapabilities(), initialization_options=options)
        result = await asyncio.wait_for(client.initialize_session(params), 60)
        assert result.capabilities.inline_completion_provider is not None
        await asyncio.wait_for(client.shutdown_session(), 30)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await client.stop()
        assert not list((tmp_path / "kspec").glob("lsp-*.token"))  # its token goes with it
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_tcp_refuses_a_client_without_the_token(model_dir: Path, tmp_path: Path) -> None:
    """Issue 15: another local user connected first and made the server read a 0600 file
    (engineTokenFile) and send it to a server of theirs."""
    secret = tmp_path / "secret"
    secret.write_text("victim-token")
    process, host, port, _ = await _tcp_server(tmp_path)
    try:
        reader, writer = await asyncio.open_connection(host, port)
        options = {"engine": "openai", "engineUrl": "http://127.0.0.1:9/v1", "engineTokenFile": str(secret), "lspToken": "guess"}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}, "initializationOptions": options}}).encode()
        writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        reply = await asyncio.wait_for(reader.read(), 30)  # the answer, then the connection is closed
        assert b'"code": -32001' in reply and b"lspToken" in reply
        assert process.returncode is None  # the server waits on for its client, it does not exit
        writer.close()
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
        # an edit above the cursor: a new engine request (the last position's answer, or its
        # decoding still going on, could serve the same position again without one)
        editor.edit(uri, (2, 0), (2, 0), "y = 2\n")
        assert await editor.inline(uri, 3, 6 + len(SECRET))
        await editor.stats()
    assert SECRET in capfd.readouterr().err  # the user asked for it
