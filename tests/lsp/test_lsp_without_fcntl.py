"""`kspec lsp` on a platform without `fcntl` (Windows): the server starts and answers with
the in-process, remote and OpenAI-compatible engines; only the shared daemon, which needs
a Unix socket and file locks, is refused with what to set instead."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from lsp_harness import FAST, START_TIMEOUT_S, Editor, server_env
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, client_capabilities
from vllm_standin import VllmLike

# The server as `kspec lsp` runs it, with `import fcntl` failing as it does on Windows.
WITHOUT_FCNTL = "import sys; sys.modules['fcntl'] = None; from kspec.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def serve_vllm_like() -> Iterator[Callable[[str], str]]:
    started: list[VllmLike] = []

    def start(model: str) -> str:
        started.append(VllmLike(model))
        return started[-1].url

    yield start
    for server in started:
        server.close()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _session(args: list[str], options: dict, runtime_dir: Path | None = None) -> tuple[Editor, Any]:
    config = ClientServerConfig(server_command=[sys.executable, "-c", WITHOUT_FCNTL, "lsp", *args], server_env=server_env(runtime_dir))
    client = await config.start()
    editor = Editor(client)  # type: ignore[arg-type]
    params = lsp.InitializeParams(capabilities=client_capabilities("visual-studio-code"), initialization_options=options)
    result = await asyncio.wait_for(client.initialize_session(params), START_TIMEOUT_S)  # type: ignore[attr-defined]
    assert result.server_info is not None and result.server_info.name == "kspec"
    return editor, client


async def _end(client) -> None:
    await asyncio.wait_for(client.shutdown_session(), 30)
    await client.stop()


async def test_inprocess_engine_completes(model_dir: Path) -> None:
    editor, client = await _session(["--engine", "inprocess"], {**FAST, "model": str(model_dir)})
    try:
        await editor.ready()
        editor.open("file:///w/a.py", "def add(a, b):\n    return ")
        assert await editor.inline("file:///w/a.py", 1, 11)
    finally:
        await _end(client)


async def test_openai_engine_connects(serve_vllm_like) -> None:
    url = serve_vllm_like("Qwen/Qwen2.5-Coder-1.5B")
    editor, client = await _session(["--engine-url", url], FAST)
    try:
        status = await editor.ready()
        assert status["model"] == "Qwen/Qwen2.5-Coder-1.5B"
        editor.open("file:///w/a.py", "def add(a, b):\n    return ")
        assert await editor.inline("file:///w/a.py", 1, 11)
    finally:
        await _end(client)


@pytest.mark.parametrize("engine", ["remote", "daemon"])
async def test_remote_starts_and_the_daemon_says_what_to_use(engine: str, tmp_path: Path, runtime_dir: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    settings = {**FAST, "engine": engine, "engineUrl": f"tcp://127.0.0.1:{_closed_port()}", "engineTokenFile": str(token)}
    editor, client = await _session([], settings, runtime_dir)
    try:
        status = await editor.wait_status(lambda s: s["state"] == "error")
        if engine == "daemon":
            assert "Unix" in status["message"] and "inprocess" in status["message"]
        else:
            assert "fcntl" not in status["message"]
    finally:
        await _end(client)
