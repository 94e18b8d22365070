"""LSP framing: header parsing, size limits, and the lock-free reader."""

from __future__ import annotations

import io
import os

from kspec.lsp_server.jsonrpc import MAX_HEADER_LINE, BadHeader, Body, ChunkReader, Oversized, read_frames


def frame(body: bytes, headers: bytes = b"") -> bytes:
    return b"Content-Length: %d\r\n" % len(body) + headers + b"\r\n" + body


def frames(data: bytes, max_bytes: int = 1000, chunk: int = 7) -> list:
    stream = io.BytesIO(data)
    return list(read_frames(ChunkReader(stream.read, chunk), max_bytes))  # type: ignore[arg-type]


def test_bodies_with_and_without_extra_headers() -> None:
    data = frame(b'{"a": 1}') + frame(b"{}", b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n") + b"content-length: 2\n\n[]"
    assert frames(data) == [Body(b'{"a": 1}'), Body(b"{}"), Body(b"[]")]


def test_oversized_body_is_skipped_with_its_head() -> None:
    big = b'{"id": 7, "method": "x", "params": "' + b"y" * 5000 + b'"}'
    result = frames(frame(big) + frame(b"{}"), max_bytes=100)
    assert isinstance(result[0], Oversized) and result[0].size == len(big) and result[0].head.startswith(b'{"id": 7')
    assert result[1] == Body(b"{}")  # the stream stays in sync


def test_garbage_headers() -> None:
    result = frames(b"hello\r\n\r\n" + frame(b"{}"))
    assert result == [BadHeader("message without Content-Length"), Body(b"{}")]
    long_line = b"X" * (MAX_HEADER_LINE * 3) + b"\r\n"
    assert frames(long_line + frame(b"{}")) == [BadHeader("header line too long"), Body(b"{}")]


def test_truncated_stream_ends_quietly() -> None:
    assert frames(b"Content-Length: 10\r\n\r\nabc") == []
    assert frames(b"") == []


def test_chunk_reader_over_a_pipe() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, frame(b'{"x": "\xc3\xa9"}'))
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as stream:
        assert list(read_frames(ChunkReader.from_stream(stream))) == [Body(b'{"x": "\xc3\xa9"}')]  # type: ignore[arg-type]
