"""A network engine before the token is shown: small budgets, a bounded number
of waiting connections, bad bodies answered (400), never a dropped connection."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from kspec.engine.api import CompletionRequest
from kspec.engine.config import EngineConfig
from kspec.engine.serve.admission import Admission, AdmissionLimits
from kspec.engine.serve.daemon import Daemon
from kspec.engine.serve.network import parse_engine_url
from kspec.lsp_server.engine_client import DaemonEngine, DaemonOptions

TOKEN = "s3cret"
CONFIG = EngineConfig(model="fake", progress=False)


class EchoEngine:
    model_name = "echo"

    def complete(self, request: CompletionRequest, cancel: Any = None) -> Any:
        from kspec.engine.api import Completion, CompletionResult

        return CompletionResult([Completion(request.prefix[::-1], 0.0)], self.model_name)


async def start(daemon: Daemon) -> tuple[asyncio.Task, int]:
    served = asyncio.ensure_future(daemon.serve_tcp("127.0.0.1", 0))
    deadline = time.monotonic() + 10
    while daemon.bound_port is None:
        assert time.monotonic() < deadline and not served.done()
        await asyncio.sleep(0.01)  # a poll for the bound port, not a wait for time to pass
    return served, daemon.bound_port


async def stop(daemon: Daemon, served: asyncio.Task) -> None:
    daemon._stop.set()
    await asyncio.wait_for(served, 10)


async def http(port: int, method: str, path: str, body: bytes = b"", token: str | None = TOKEN, extra: bytes = b"") -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await exchange(reader, writer, method, path, body, token, extra)
    finally:
        writer.close()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, path: str, body: bytes = b"", token: str | None = TOKEN, extra: bytes = b"") -> tuple[int, Any]:
    auth = b"Authorization: Bearer %s\r\n" % token.encode() if token else b""
    writer.write(b"%s %s HTTP/1.1\r\nHost: x\r\n%s%sContent-Length: %d\r\n\r\n" % (method.encode(), path.encode(), auth, extra, len(body)) + body)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split(b" ", 2)[1])
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    return status, json.loads(await asyncio.wait_for(reader.readexactly(length), 10))


async def test_no_body_is_read_before_the_token() -> None:
    daemon = Daemon(CONFIG, lambda config, progress: EchoEngine(), idle_timeout_s=None, token=TOKEN)
    served, port = await start(daemon)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # A 16 MB body announced, none sent: the refusal comes at once, from the head alone.
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 401")
        await asyncio.wait_for(reader.read(), 5)  # then the connection is closed
        writer.close()

        # A hello frame larger than the budget before the token: refused, not awaited.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((1 << 20).to_bytes(4, "big"))
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        await stop(daemon, served)


async def test_waiting_connections_are_bounded_and_real_clients_get_in() -> None:
    daemon = Daemon(CONFIG, lambda config, progress: EchoEngine(), idle_timeout_s=None, token=TOKEN)
    daemon.admission = Admission(AdmissionLimits(connections=8, timeout_s=2.0))
    served, port = await start(daemon)
    flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for index in range(50):  # silent, or a request head that never ends
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\n" if index % 2 else b"")
            flood.append((reader, writer))
        deadline = time.monotonic() + 10
        while daemon.admission.dropped < 42:  # the daemon accepts them in its own time
            assert time.monotonic() < deadline, daemon.admission.dropped
            await asyncio.sleep(0.01)  # a poll of the daemon's count, not a wait for time to pass
        assert len(daemon.admission) <= 8

        client = DaemonEngine(DaemonOptions(config=CONFIG, url=parse_engine_url(f"tcp://127.0.0.1:{port}"), token=TOKEN, connect_timeout_s=5), lambda s: None)
        result = await asyncio.wait_for(client.complete(CompletionRequest(prefix="abc")), 10)
        assert result.completions[0].text == "cba"
        client.close()
        assert (await http(port, "GET", "/v1/models"))[0] == 200

        # Whoever did not show a token within the time is gone.
        for reader, _ in flood:
            try:
                assert await asyncio.wait_for(reader.read(), 10) == b""
            except ConnectionResetError:  # dropped to make room
                pass
    finally:
        for _, writer in flood:
            writer.close()
        await stop(daemon, served)


async def test_bad_json_bodies_are_400_and_the_connection_lives(random_engine: Any) -> None:
    daemon = Daemon(CONFIG, lambda config, progress: random_engine, idle_timeout_s=None, token=TOKEN)
    served, port = await start(daemon)
    try:
        deadline = time.monotonic() + 60
        while (await http(port, "GET", "/health"))[0] != 200:
            assert time.monotonic() < deadline
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        status, reply = await exchange(reader, writer, "POST", "/v1/completions", b"[" * 100_000)  # RecursionError in json
        assert status == 400 and "nested" in reply["error"]["message"]
        status, reply = await exchange(reader, writer, "POST", "/v1/completions", b'{"prompt": "x = \\ud800", "max_tokens": 2}')
        assert status == 400 and "surrogate" in reply["error"]["message"], reply  # was 503 "engine error: TypeError"
        status, reply = await exchange(reader, writer, "POST", "/v1/completions", b'{"prompt": "x = ", "max_tokens": 2}')
        assert status == 200, reply  # the same connection
        writer.close()
    finally:
        await stop(daemon, served)
