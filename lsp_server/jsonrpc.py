"""Reading LSP messages with limits, and answering the malformed ones.

pygls' own loop reads any Content-Length it is given and drops a message whose params
do not validate without answering, so the client waits forever. Here a reader thread
frames messages (header lines and bodies bounded in size) and the event loop dispatches
them: unparsable JSON gets a Parse error (id null), a non-object an Invalid Request, a
request whose params do not validate an Invalid Params error under its own id, and an
oversized message is skipped (answered with an error when its id can be found).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator

from pygls.exceptions import JsonRpcException

log = logging.getLogger("kspec.jsonrpc")

MAX_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_HEADER_LINE = 8192
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)\s*", re.IGNORECASE)
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,15}|"(?:[^"\\]|\\.){0,128}")')


@dataclass(frozen=True)
class Body:
    data: bytes


@dataclass(frozen=True)
class Oversized:
    size: int
    head: bytes  # the first bytes, to find the request id


@dataclass(frozen=True)
class BadHeader:
    reason: str


Frame = Body | Oversized | BadHeader


class ChunkReader:
    """readline/read over a raw `read(n)` (os.read on a fd, socket.recv).

    Python's BufferedReader takes a lock that a daemon thread blocked in it still holds
    at interpreter shutdown, which aborts the process; this reader holds none."""

    def __init__(self, read_chunk: Callable[[int], bytes], chunk: int = 1 << 16):
        self._read_chunk = read_chunk
        self._chunk = chunk
        self._buffer = bytearray()
        self._eof = False

    @classmethod
    def from_stream(cls, stream: Any) -> "ChunkReader":
        if hasattr(stream, "fileno"):
            try:
                fd = stream.fileno()
                return cls(lambda n: os.read(fd, n))
            except (OSError, ValueError):
                pass
        return cls(getattr(stream, "read1", stream.read))

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._read_chunk(self._chunk)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(self._buffer):
                return self._take(limit)
            if not self._fill():
                return self._take(len(self._buffer))

    def read(self, size: int) -> bytes:
        while len(self._buffer) < size and self._fill():
            pass
        return self._take(min(size, len(self._buffer)))

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def read_frames(stream: BinaryIO, max_bytes: int = MAX_MESSAGE_BYTES) -> Iterator[Frame]:
    """Frames from a blocking byte stream until it ends."""
    length: int | None = None
    while True:
        line = stream.readline(MAX_HEADER_LINE)
        if not line:
            return
        if not line.endswith(b"\n"):  # an over-long header line: skip the rest of it
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_HEADER_LINE)
            yield BadHeader("header line too long")
            length = None
            continue
        if line.strip():
            match = _CONTENT_LENGTH.fullmatch(line)
            if match:
                length = int(match.group(1))
            continue  # other headers (Content-Type) are ignored
        if length is None:
            yield BadHeader("message without Content-Length")
            continue
        if length > max_bytes:
            head = stream.read(min(length, 4096))
            remaining = length - len(head)
            while remaining > 0:
                chunk = stream.read(min(remaining, 1 << 20))
                if not chunk:
                    return
                remaining -= len(chunk)
            yield Oversized(length, head)
        else:
            body = stream.read(length)
            if len(body) < length:
                return
            yield Body(body)
        length = None


def frames_to_loop(stream: BinaryIO, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, max_bytes: int) -> threading.Thread:
    """Read frames on a daemon thread (never joined: exit must not wait for stdin) into `queue`; None at the end."""

    reader = ChunkReader.from_stream(stream)

    def pump() -> None:
        try:
            for frame in read_frames(reader, max_bytes):  # type: ignore[arg-type]
                loop.call_soon_threadsafe(queue.put_nowait, frame)
        except (OSError, ValueError) as exc:
            log.warning("input stream failed: %s", exc)
        finally:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except RuntimeError:
                pass

    thread = threading.Thread(target=pump, name="kspec-lsp-reader", daemon=True)
    thread.start()
    return thread


class Dispatcher:
    """Turns frames into pygls messages, answering what pygls cannot."""

    def __init__(self, protocol: Any, normalize: Callable[[dict[str, Any]], None], report: Callable[[str], None], max_bytes: int = MAX_MESSAGE_BYTES):
        self.protocol = protocol
        self.max_bytes = max_bytes
        self.normalize = normalize  # fixes known client quirks in place before validation
        self.report = report  # a user-visible message (oversized input)

    def error(self, msg_id: Any, code: int, message: str) -> None:
        # A plain dict: pygls' typed response drops `"id": null`, which JSON-RPC requires
        # when the id could not be read (and without which clients take it for a notification).
        self.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def dispatch(self, frame: Frame) -> None:
        if isinstance(frame, BadHeader):
            log.warning("skipping input: %s", frame.reason)
            return
        if isinstance(frame, Oversized):
            match = _ID.search(frame.head)
            log.warning("skipping a message of %d bytes (limit %d)", frame.size, self.max_bytes)
            self.report(f"kspec: ignored a message of {frame.size} bytes (the limit is {self.max_bytes})")
            if match:
                self.error(json.loads(match.group(1)), INVALID_REQUEST, f"message of {frame.size} bytes exceeds the limit of {self.max_bytes}")
            return
        try:
            text = frame.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            log.warning("message is not valid UTF-8 (byte %d); invalid bytes replaced", exc.start)
            text = frame.data.decode("utf-8", "replace")
        try:
            data = json.loads(text)
        except ValueError as exc:
            self.error(None, PARSE_ERROR, f"Parse error: {exc.msg} at character {exc.pos}")
            return
        if not isinstance(data, dict):
            self.error(None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object (batches are not supported)")
            return
        msg_id = data.get("id")
        valid_id = isinstance(msg_id, (int, str)) and not isinstance(msg_id, bool)
        method = data.get("method")
        if data.get("jsonrpc") != "2.0" or ("method" in data and not isinstance(method, str)) or ("id" in data and msg_id is not None and not valid_id):
            self.error(msg_id if valid_id else None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")
            return
        if "method" not in data and not ("result" in data or "error" in data):
            self.error(msg_id if valid_id else None, INVALID_REQUEST, "Invalid Request: no method")
            return
        try:
            self.normalize(data)
            message = self.protocol.structure_message(data)
        except JsonRpcException as exc:
            if method is not None and valid_id:
                cause = exc.__cause__
                self.error(msg_id, INVALID_PARAMS, f"Invalid params for {method}: {_describe(cause) if cause else exc.message}")
            else:
                log.warning("ignoring a malformed %s notification", method or "response")
            return
        try:
            self.protocol.handle_message(message)
        except Exception:  # pygls answers handler errors itself; this is a bug in dispatch
            log.exception("failed to handle %s", method or "a response")


def _describe(error: BaseException) -> str:
    """A one-line reason from a cattrs validation error (its first leaf)."""
    leaf: BaseException = error
    while getattr(leaf, "exceptions", None):
        leaf = leaf.exceptions[0]  # type: ignore[attr-defined]
    notes = getattr(leaf, "__notes__", None) or []
    where = f" ({notes[0]})" if notes else ""
    return f"{type(leaf).__name__}: {str(leaf)[:200]}{where}"
