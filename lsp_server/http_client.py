"""A small asyncio HTTP/1.1 client for JSON APIs (h11 over asyncio streams, http and
https), for the language server's remote backend. One connection per request: a
cancelled request closes its connection, which tells the server to stop decoding it."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import h11

from kspec.engine.serve.protocol import EngineUrl

MAX_RESPONSE = 16 * 1024 * 1024


class HttpError(Exception):
    """No usable answer: the connection failed or the reply was not HTTP/JSON."""


async def request_json(
    url: EngineUrl,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """-> (HTTP status, decoded JSON body). Raises HttpError or asyncio.TimeoutError."""
    return await asyncio.wait_for(_exchange(url, method, path, body, headers or {}, tls), timeout_s)


async def _exchange(url: EngineUrl, method: str, path: str, body: Any, headers: dict[str, str], tls: ssl.SSLContext | None) -> tuple[int, Any]:
    if url.secure and tls is None:
        tls = ssl.create_default_context()
    try:
        reader, writer = await asyncio.open_connection(url.host, url.port, ssl=tls if url.secure else None, server_hostname=url.host if url.secure else None)
    except (OSError, ssl.SSLError) as exc:
        raise HttpError(f"cannot connect to {url}: {exc}") from exc
    try:
        connection = h11.Connection(h11.CLIENT)
        payload = b"" if body is None else json.dumps(body).encode()
        request_headers = [("host", f"{url.host}:{url.port}"), ("accept", "application/json"), ("connection", "close")]
        request_headers += [(name.lower(), value) for name, value in headers.items()]
        request_headers += [("content-type", "application/json"), ("content-length", str(len(payload)))] if body is not None else []
        writer.write(connection.send(h11.Request(method=method, target=url.path + path, headers=request_headers)))
        if payload:
            writer.write(connection.send(h11.Data(data=payload)))
        writer.write(connection.send(h11.EndOfMessage()))
        await writer.drain()
        status, data = await _read_response(connection, reader)
    except (OSError, h11.ProtocolError) as exc:
        raise HttpError(f"HTTP exchange with {url} failed: {exc}") from exc
    finally:
        writer.close()
    try:
        return status, json.loads(data) if data else None
    except ValueError as exc:
        raise HttpError(f"{url}{path} answered {status} with a body that is not JSON") from exc


async def _read_response(connection: h11.Connection, reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status = 0
    parts: list[bytes] = []
    size = 0
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_RESPONSE:
                raise HttpError(f"response over {MAX_RESPONSE} bytes")
            parts.append(bytes(event.data))
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, b"".join(parts)
