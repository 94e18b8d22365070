"""Frames on an engine connection: a 4-byte big-endian length, then that many bytes of body (a
message of wire.py). A frame over `MAX_FRAME` is a protocol error on either side and closes the
connection; what a body holds is wire.py's business."""

from __future__ import annotations

import asyncio
import struct

from kspec.engine.errors import ProtocolError

MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


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
