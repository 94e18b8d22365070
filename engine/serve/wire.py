"""The typed messages between an engine and its clients, and their one codec (msgpack, by msgspec).

A connection opens with a `Hello` each way: the client's carries its protocol version (and the
token a network engine asks for), the engine's its version, pid and `Status`. Then a client sends
`Complete` and `Cancel`; a request's life is one stream of events: `Interim` answers (what was
complete at the first-answer moment, then after each round that changed it), then exactly one of
`Final` or `Failed` (`Failed.kind` "cancelled" for a cancelled request); `Status` goes out whenever
the engine's state changes. Each message is a map whose "type" names its kind.

On the socket each message is one frame: a 4-byte big-endian length, then that many bytes of
body. A frame over `MAX_FRAME` is a protocol error on either side and closes the connection.

`encode` and `decode` (`send` and `read_frame` around them) are the only way in and out: a message that does not decode is an
InputError when its request is at fault (the client's mistake, answered for that request alone)
and a ProtocolError otherwise, each with msgspec's one-line reason.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Union

import msgspec

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.errors import InputError, KspecError, ProtocolError, describe, from_kind
from kspec.engine.serve.status import Status

PROTOCOL_VERSION = 1  # in the daemon's socket name too: daemons of other versions never answer
MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class _Message(msgspec.Struct, frozen=True, tag_field="type", omit_defaults=True):
    """A map on the wire whose "type" is its class's tag."""


class Hello(_Message, tag="hello"):
    version: int
    token: str | None = None  # the client's, for an engine that asks for one
    pid: int | None = None  # the engine's
    status: Status | None = None  # the engine's


class Complete(_Message, tag="complete"):
    id: str
    request: CompletionRequest


class Cancel(_Message, tag="cancel"):
    id: str


class Interim(_Message, tag="early"):
    id: str
    result: CompletionResult


class Final(_Message, tag="result"):
    id: str
    result: CompletionResult


class Failed(_Message, tag="error"):
    id: str | None  # None: the handshake failed
    kind: str  # engine/errors.py's kinds: input, deadline, unavailable, cancelled, protocol
    message: str = "engine error"

    @classmethod
    def of(cls, request_id: str | None, error: BaseException) -> Failed:
        answer = describe(error)
        return cls(request_id, answer.kind, answer.message)

    def error(self) -> KspecError:
        """What the engine raised, as the client raises it."""
        return from_kind(self.kind, self.message)


Message = Union[Hello, Complete, Cancel, Interim, Final, Failed, Status]


class Envelope(msgspec.Struct, frozen=True):
    """What any map on the wire says of itself, read without trusting the rest: its "type" and "id"."""

    type: Any = None
    id: Any = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)
_ENVELOPE = msgspec.msgpack.Decoder(Envelope)


def encode(message: Message) -> bytes:
    """The body of a frame. InputError for text msgpack cannot carry (a lone surrogate)."""
    try:
        return _ENCODER.encode(message)
    except UnicodeEncodeError as exc:
        raise InputError(f"text that is not valid Unicode cannot be sent (a lone surrogate at character {exc.start})") from None


def decode(body: bytes) -> Message:
    """The typed message of a frame's body; InputError for a request that is not one, ProtocolError
    for anything else that is not a message of this protocol."""
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise _rejected(exc, envelope(body).type) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed frame: {exc}") from None


def envelope(body: bytes) -> Envelope:
    """The type and id of a body that may not decode as a message (to answer or route its failure);
    both None where the body is no map."""
    try:
        found = _ENVELOPE.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Envelope()
    return Envelope(found.type if isinstance(found.type, str) else None, None if found.id is None else str(found.id))


def _rejected(error: msgspec.ValidationError, kind: str | None = None) -> KspecError:
    """The user's one-line error for a message msgspec refused: "request field 'k': Expected `int`,
    got `str`" (InputError) when the message's request is at fault, else "malformed 'result'
    message: ..." (ProtocolError)."""
    reason, _, where = str(error).partition(" - at `")
    where = where.rstrip("`")
    if where == "$.request" or where.startswith(("$.request.", "$.request[")):
        field = where[len("$.request.") :]
        return InputError(f"request field {field!r}: {reason}" if field else f"request: {reason}")
    if where == "$.type" or kind is None:
        return ProtocolError(f"unknown message type {kind!r}" if where == "$.type" else f"malformed message: {reason}")
    return ProtocolError(f"malformed {kind!r} message: {reason}" + (f" (at {where})" if where else ""))


def frame(body: bytes) -> bytes:
    """`body` with its length before it."""
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, header: bytes | None = None, limit: int | None = None) -> bytes | None:
    """The next frame's body, or None at a clean end of stream. `header`: its first 4 bytes,
    when the caller has already read them (to tell the protocol from HTTP); `limit`: a
    smaller size limit than MAX_FRAME (a hello, before the token is verified)."""
    if header is None:
        try:
            header = await reader.readexactly(_HEADER.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise ProtocolError("stream ended inside a frame header") from exc
            return None
    (size,) = _HEADER.unpack(header)
    limit = MAX_FRAME if limit is None else min(limit, MAX_FRAME)
    if size > limit:
        raise ProtocolError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("stream ended inside a frame") from exc


def write_frame(writer: asyncio.StreamWriter, body: bytes) -> None:
    writer.write(frame(body))


def send(writer: asyncio.StreamWriter, message: Message) -> None:
    """`message` as one frame on `writer` (buffered; the caller drains)."""
    write_frame(writer, encode(message))
