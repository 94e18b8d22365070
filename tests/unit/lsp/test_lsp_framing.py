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


# --- a wrong Content-Length or stray bytes cost only the messages they touch ---

A, B = b'{"id": 1}', b'{"id": 2}'


def test_a_wrong_length_resynchronises_on_the_next_header() -> None:
    for length in (len(A) - 1, len(A) + 1, len(A) + 5, len(A) + 40):
        result = frames(frame(A)[: -len(A)].replace(b"%d" % len(A), b"%d" % length) + A + frame(B) + frame(B))
        assert result[-2:] == [Body(B), Body(B)], (length, result)
    assert frames(frame(A)[: -len(A)].replace(b"9", b"10") + A + frame(B))[0] == Body(A)  # too long: the value, the rest read again


def test_lengths_that_are_no_length() -> None:
    for header in (b"Content-Length: -5", b"Content-Length: twelve", b"Content-Length: 12abc"):
        result = frames(header + b"\r\n\r\n" + A + frame(B))
        assert result[-1] == Body(B) and all(isinstance(f, BadHeader) for f in result[:-1]), result


def test_a_huge_length_skips_only_to_the_next_header() -> None:
    for digits in (b"1000000000000", b"1" + b"0" * 5000):
        result = frames(b"Content-Length: " + digits + b"\r\n\r\n" + A + frame(B), max_bytes=100)
        assert isinstance(result[0], Oversized) and result[0].head == A
        assert result[1:] == [Body(B)]


def test_stray_bytes_before_a_header() -> None:
    assert frames(b"junk" + frame(A)) == [BadHeader("4 bytes before a header"), Body(A)]
    result = frames(b"x" * (MAX_HEADER_LINE * 2 + 10) + frame(A))
    assert result[-1] == Body(A) and BadHeader("header line too long") in result


def test_a_body_waiting_for_bytes_stops_at_the_next_header() -> None:
    """A length too long by more than what follows: the reader must not wait for bytes that
    belong to later messages (it would only answer after they all arrived)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, frame(A)[: -len(A)].replace(b"9", b"900") + A + frame(B))  # no more bytes follow yet
    with os.fdopen(read_fd, "rb") as stream:
        reader = read_frames(ChunkReader.from_stream(stream))
        assert next(reader) == Body(A)
        assert next(reader) == Body(B)
    os.close(write_fd)


def test_header_text_inside_json_strings_is_body() -> None:
    body = b'{"text": "Content-Length: 5\\r\\n\\r\\n"}'  # escaped line breaks: no header
    assert frames(frame(body) + frame(B)) == [Body(body), Body(B)]
