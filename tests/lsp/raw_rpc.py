"""A raw JSON-RPC client of a real `kspec lsp` process (imported by tests as `raw_rpc`).

Unlike pytest-lsp's client it writes any bytes (bad framing, deep nesting, wrong types)
and keeps every answer by id, so a test can check that each request was answered. The
server's stderr goes to a file (a pipe nobody reads would block a chatty server).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from lsp_harness import server_command, server_env

ANSWER_TIMEOUT_S = 60.0


def frame(body: bytes, length: int | None = None) -> bytes:
    """`body` framed with its Content-Length (or a wrong one)."""
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


class RawServer:
    def __init__(self, process: asyncio.subprocess.Process, stderr_path: Path):
        self.process = process
        self.stderr_path = stderr_path
        self.answers: dict[Any, dict[str, Any]] = {}  # by id; id None: errors for messages without a readable id
        self.unnamed_errors: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, stderr_path: Path, *args: str) -> "RawServer":
        with open(stderr_path, "wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *server_command(*args), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=server_env()
            )
        return cls(process, stderr_path)

    async def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            length = None
            while True:
                line = await stdout.readline()
                if not line:
                    return
                if not line.strip():
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length is not None, "the server wrote a message without Content-Length"
            message = json.loads(await stdout.readexactly(length))
            if "method" in message and "id" in message:  # a request of the server's (workspace/configuration ...)
                self.write(encode({"jsonrpc": "2.0", "id": message["id"], "result": None}))
            elif "method" in message:
                self.notifications.append(message)
            elif message.get("id") is None:
                self.unnamed_errors.append(message)
            else:
                self.answers[message["id"]] = message
            self._arrived.set()

    def write(self, body: bytes, length: int | None = None) -> None:
        """One framed message (`length`: a wrong Content-Length)."""
        self.write_bytes(frame(body, length))

    def write_bytes(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)

    async def drain(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.drain()

    def send(self, msg_id: Any, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.write(encode(message))

    def notify(self, method: str, params: Any) -> None:
        self.write(encode({"jsonrpc": "2.0", "method": method, "params": params}))

    async def answer(self, msg_id: Any, timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        """The answer to `msg_id`, waiting for it (no sleeps)."""
        await self.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while msg_id not in self.answers:
            if self._reader.done():
                raise AssertionError(f"the server closed its output (exit {self.process.returncode}) before answering {msg_id!r}")
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no answer to {msg_id!r} within {timeout} s")
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return self.answers[msg_id]

    async def request(self, msg_id: Any, method: str, params: Any = None, timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        self.send(msg_id, method, params)
        return await self.answer(msg_id, timeout)

    async def initialize(self, options: dict[str, Any], msg_id: Any = "init", capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        params = {"processId": os.getpid(), "rootUri": None, "capabilities": capabilities or {}, "initializationOptions": options}
        answer = await self.request(msg_id, "initialize", params)
        assert "result" in answer, answer
        self.notify("initialized", {})
        return answer

    async def wait_ready(self, timeout: float = ANSWER_TIMEOUT_S) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not any(n["method"] == "$/kspec/status" and n["params"]["state"] == "ready" for n in self.notifications):
            self._arrived.clear()
            remaining = deadline - loop.time()
            assert remaining > 0 and not self._reader.done(), "the engine never became ready"
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    async def close(self) -> int:
        """shutdown + exit when it still runs; its exit code."""
        if self.process.returncode is None:
            try:
                await self.request("bye", "shutdown", timeout=30)
                self.notify("exit", None)
                await self.drain()
                return await asyncio.wait_for(self.process.wait(), 30)
            finally:
                if self.process.returncode is None:
                    self.process.kill()
                    await self.process.wait()
                self._reader.cancel()
        self._reader.cancel()
        return self.process.returncode
