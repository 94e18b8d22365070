"""Reading LSP messages with limits, and answering the malformed ones.

pygls' own loop reads any Content-Length it is given and drops a message whose params
do not validate without answering, so the client waits forever. Here a reader thread
frames messages (header lines and bodies bounded in size) and the event loop dispatches
them: unparsable JSON (or nested too deep) gets a Parse error (id null, or the id its
start shows), a non-object an Invalid Request, a request whose params do not validate an
Invalid Params error under its own id, and an oversized message is skipped (answered
with an error when its id can be found). A wrong Content-Length or stray bytes never
leave the reader out of step: it finds the next header (see `read_frames`). Before validation
the dispatcher fixes one known client quirk, the trigger kind's older numbering (`TriggerKinds`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.protocol import default_converter

from kspec.engine.serve.json_input import JsonInputError, parse_json
from kspec.lsp_server.pygls_adapter import send_raw

log = logging.getLogger("kspec.jsonrpc")

MAX_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_HEADER_LINE = 8192
HEAD_BYTES = 4096  # of a skipped message, kept to find its request id
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
UNAUTHORIZED = -32001  # a server-defined error: the client did not show the token (--tcp)
# A Content-Length header at the end of a line (bytes that are not a header may precede it).
_CONTENT_LENGTH = re.compile(rb"content-length:[ \t]*(\d+)[ \t]*\r?\n\Z", re.IGNORECASE)
# Where the next message's header begins inside bytes taken for a body. Valid JSON never
# holds it: a raw line break cannot be inside a string, and `length: 5` outside one is no JSON.
_HEADER_START = re.compile(rb"content-length:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
_LOOK_BACK = 64  # bytes before a chunk's line break that a header split across chunks may start in
_MAX_DIGITS = 18
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
    """readline/read over a raw `read(n)` (os.read on a fd, socket.recv), with bytes put back.

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

    def read_some(self, size: int) -> bytes:
        """Up to `size` bytes, waiting only while none are there (b"" at the end)."""
        if not self._buffer:
            self._fill()
        return self._take(min(size, len(self._buffer)))

    def unread(self, data: bytes) -> None:
        """Bytes read too far (the start of the next message), read again next."""
        self._buffer[:0] = data

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def read_frames(stream: ChunkReader, max_bytes: int = MAX_MESSAGE_BYTES) -> Iterator[Frame]:
    """Frames from a blocking byte stream until it ends.

    A wrong Content-Length or stray bytes cost the messages they touch, never the ones
    after them: bytes before a header on its line are dropped, a body stops where the
    next header begins (a short length, or a long one waiting for bytes that belong to
    the next message), and what follows a complete JSON value in a body (a long length)
    is read again as the start of the next message."""
    length: int | None = None
    while True:
        line, skipped = _header_line(stream)
        if skipped:
            yield BadHeader(skipped)
        if not line:
            return
        if line.strip():
            match = _CONTENT_LENGTH.search(line)
            if match:
                if match.start() > 0:
                    yield BadHeader(f"{match.start()} bytes before a header")
                digits = match.group(1).lstrip(b"0") or b"0"
                length = int(digits) if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS
            continue  # other headers (Content-Type) are ignored
        if length is None:
            yield BadHeader("message without Content-Length")
            continue
        if length > max_bytes:
            head = _skip(stream, length)
            if head is None:
                return
            yield Oversized(length, head)
        else:
            body = _read_body(stream, length)
            if body is None:
                return
            yield Body(body)
        length = None


def _header_line(stream: ChunkReader) -> tuple[bytes, str]:
    """The next line (b"" at the end) and why bytes were skipped: an over-long line keeps
    only its end, where a header may start after the bytes that are not one."""
    line = stream.readline(MAX_HEADER_LINE)
    if not line or line.endswith(b"\n"):
        return line, ""
    while line and not line.endswith(b"\n"):
        kept = line[-_LOOK_BACK:]
        line = stream.readline(MAX_HEADER_LINE)
        line = kept + line if line else b""
    return line, "header line too long"


def _header_start(data: bytearray, start: int) -> int:
    """Where a header begins in `data` at or after `start`, else -1."""
    if data.find(b"\n", start) < 0:  # the common case, a body without line breaks: no regex
        return -1
    match = _HEADER_START.search(data, max(0, start - _LOOK_BACK))
    return match.start() if match else -1


def _read_body(stream: ChunkReader, length: int) -> bytes | None:
    """`length` bytes, fewer when the next message's header begins earlier (put back),
    and without bytes after a complete JSON value (put back); None at the end of the stream."""
    data = bytearray()
    while len(data) < length:
        chunk = stream.read_some(length - len(data))
        if not chunk:
            return None
        data += chunk
        cut = _header_start(data, len(data) - len(chunk))
        if cut >= 0:
            stream.unread(bytes(data[cut:]))
            return bytes(data[:cut])
    rest = _after_value(data)
    if rest:
        stream.unread(bytes(data[len(data) - rest :]))
        del data[len(data) - rest :]
    return bytes(data)


def _after_value(data: bytearray) -> int:
    """How many bytes follow the JSON value that `data` starts with (0 when it is no JSON)."""
    if data.rstrip().endswith(b"}"):  # a message: nothing runs on after it (no parse needed)
        return 0
    text = bytes(data).decode("utf-8", "surrogateescape")
    try:
        _, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
    except (ValueError, RecursionError):
        return 0
    rest = text[end:]
    return len(rest.encode("utf-8", "surrogateescape")) if rest.strip() else 0


def _skip(stream: ChunkReader, length: int) -> bytes | None:
    """Skips a message over the size limit, up to where the next header begins; its first
    HEAD_BYTES bytes (None at the end of the stream)."""
    head = bytearray()
    window = bytearray()  # the last bytes seen, where a header may begin
    remaining = length
    while remaining > 0:
        chunk = stream.read_some(min(remaining, 1 << 20))
        if not chunk:
            return None
        remaining -= len(chunk)
        if len(head) < HEAD_BYTES:
            head += chunk[: HEAD_BYTES - len(head)]
        seen = len(window)
        window += chunk
        cut = _header_start(window, seen)
        if cut >= 0:
            stream.unread(bytes(window[cut:]))
            del head[max(0, length - remaining - (len(window) - cut)) :]  # the next message's bytes are not its head
            break
        del window[: max(0, len(window) - _LOOK_BACK)]
    return bytes(head)


def frames_to_loop(frames: Iterator[Frame], loop: asyncio.AbstractEventLoop, arrived: Callable[[Frame | None], None]) -> threading.Thread:
    """Read frames (read_frames over a stream) on a daemon thread (never joined: exit must
    not wait for stdin), each handed to `arrived` on `loop` as it is read, in order; None at the end."""

    def pump() -> None:
        try:
            for frame in frames:
                loop.call_soon_threadsafe(arrived, frame)
        except (OSError, ValueError) as exc:
            log.warning("input stream failed: %s", exc)
        finally:
            try:
                loop.call_soon_threadsafe(arrived, None)
            except RuntimeError:
                pass

    thread = threading.Thread(target=pump, name="kspec-lsp-reader", daemon=True)
    thread.start()
    return thread


class TriggerKinds:
    """Inline-completion trigger kinds in either numbering, normalized before validation, learnt
    from what one client sends. LSP 3.18 says Invoked = 1, Automatic = 2; older clients (the
    proposed API) sent Invoked = 0, Automatic = 1. A client that ever sends 0 uses the old
    numbering, so its 1 means Automatic. A missing context means Invoked."""

    def __init__(self) -> None:
        self.legacy = False

    def normalize(self, message: dict[str, Any]) -> None:
        """Rewrites an inline-completion request's trigger kind to LSP 3.18's numbering, in place."""
        if message.get("method") != lsp.TEXT_DOCUMENT_INLINE_COMPLETION or not isinstance(message.get("params"), dict):
            return
        params = message["params"]
        context = params.setdefault("context", {"triggerKind": 1})
        if not isinstance(context, dict):
            return
        kind = context.setdefault("triggerKind", 1)
        if kind == 0:
            self.legacy = True
            context["triggerKind"] = 1
        elif kind == 1 and self.legacy:
            context["triggerKind"] = 2


class Dispatcher:
    """Turns one connection's frames into pygls messages, answering what pygls cannot."""

    def __init__(self, protocol: Any, report: Callable[[str], None], max_bytes: int = MAX_MESSAGE_BYTES):
        self.protocol = protocol
        self.max_bytes = max_bytes
        self.trigger_kinds = TriggerKinds()  # the client's numbering, fixed in place before validation
        self.report = report  # a user-visible message (oversized input)

    async def serve(self, frames: Iterator[Frame]) -> None:
        """Each frame the reader thread reads is dispatched on the running loop as it arrives (one
        loop callback each, in order: no queue of our own holds it), until the input ends."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future = loop.create_future()

        def arrived(frame: Frame | None) -> None:
            if ended.done():
                return
            if frame is None:
                ended.set_result(None)
            else:
                self.dispatch(frame)

        frames_to_loop(frames, loop, arrived)
        await ended

    def error(self, msg_id: Any, code: int, message: str) -> None:
        # A plain dict: pygls' typed response drops `"id": null`, which JSON-RPC requires
        # when the id could not be read (and without which clients take it for a notification).
        send_raw(self.protocol, {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def dispatch(self, frame: Frame) -> None:
        if isinstance(frame, BadHeader):
            log.warning("skipping input: %s", frame.reason)
            return
        if isinstance(frame, Oversized):
            log.warning("skipping a message of %d bytes (limit %d)", frame.size, self.max_bytes)
            self.report(f"kspec: ignored a message of {frame.size} bytes (the limit is {self.max_bytes})")
            msg_id = _find_id(frame.head)
            if msg_id is not None:
                self.error(msg_id, INVALID_REQUEST, f"message of {frame.size} bytes exceeds the limit of {self.max_bytes}")
            return
        try:
            text = frame.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            log.warning("message is not valid UTF-8 (byte %d); invalid bytes replaced", exc.start)
            text = frame.data.decode("utf-8", "replace")
        try:
            data = parse_json(text)
        except JsonInputError as exc:
            # JSON-RPC answers a Parse error with id null; a request cut short by a wrong
            # Content-Length still has its id at the start, and its client waits for it.
            self.error(_find_id(frame.data[:HEAD_BYTES]), PARSE_ERROR, f"Parse error: {exc.message}")
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
        if method is not None:
            data.setdefault("params", None)  # JSON-RPC lets a request or notification omit params; pygls' types need the key
        try:
            self.trigger_kinds.normalize(data)
            message = self.protocol.structure_message(data)
        except JsonRpcException as exc:
            if method is not None and valid_id:
                cause = exc.__cause__
                reason = f"Invalid params for {method}: {_describe(cause) if cause else exc.message}"
                log.warning("request %s: %s", msg_id, reason)
                self.error(msg_id, INVALID_PARAMS, reason)
            else:
                log.warning("ignoring a malformed %s notification", method or "response")
            return
        try:
            self.protocol.handle_message(message)
        except Exception:  # pygls answers handler errors itself; this is a bug in dispatch
            log.exception("failed to handle %s", method or "a response")


def strict_converter() -> Any:
    """pygls' converter, except that JSON numbers, strings and booleans are taken only for
    fields of their own type: cattrs would turn a position's 1.5, "3" or true into 1, 3
    and 1 (now an Invalid Params error, like any other wrong type)."""
    converter = default_converter()

    def exact(kind: type) -> Callable[[Any, Any], Any]:
        def structure(value: Any, type_: Any) -> Any:
            if type(value) is not kind:
                raise TypeError(f"expected {_JSON_TYPES[kind]}, got {_json_type(value)}")
            return value if type_ is kind else type_(value)  # an enum of ints or strings checks its values

        return structure

    def number(value: Any, _: Any) -> float:
        if type(value) not in (int, float):
            raise TypeError(f"expected a number, got {_json_type(value)}")
        return float(value)

    for kind in (int, str, bool):  # also reached for lsprotocol's enums (subclasses of int or str)
        converter.register_structure_hook(kind, exact(kind))
    converter.register_structure_hook(float, number)
    return converter


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _find_id(data: bytes) -> int | str | None:
    """The first `"id": ...` of a message that could not be parsed, if any."""
    match = _ID.search(data)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, (int, str)) else None


def _describe(error: BaseException) -> str:
    """A one-line reason from a cattrs validation error (its first leaf)."""
    leaf: BaseException = error
    while getattr(leaf, "exceptions", None):
        leaf = leaf.exceptions[0]  # type: ignore[attr-defined]
    notes = getattr(leaf, "__notes__", None) or []
    where = f" ({notes[0]})" if notes else ""
    return f"{type(leaf).__name__}: {str(leaf)[:200]}{where}"
