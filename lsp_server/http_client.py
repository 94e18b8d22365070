"""The remote backend's HTTP client for JSON APIs (httpx): one pool of keep-alive
connections per engine, so a keystroke reuses a warm TCP (and TLS) connection instead
of opening one; proxies from the environment (HTTPS_PROXY / HTTP_PROXY / ALL_PROXY,
NO_PROXY), as curl and pip take them. Cancelling a request (its task, or its deadline)
closes only that request's connection, which tells the server to stop decoding it; the
other pooled connections stay."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx

from kspec.engine.serve.network import EngineUrl

MAX_RESPONSE = 16 * 1024 * 1024
KEEPALIVE_S = 60.0  # an idle pooled connection is closed after this long
MAX_CONNECTIONS = 16  # requests in flight at once (several documents, early answers)


class HttpError(Exception):
    """No usable answer: the connection failed or the reply was not HTTP/JSON."""


class JsonClient:
    """Requests to one engine URL over a connection pool; `aclose()` when done."""

    def __init__(self, url: EngineUrl, tls: ssl.SSLContext | None = None, headers: dict[str, str] | None = None) -> None:
        self.url = url
        host = f"[{url.host}]" if ":" in url.host else url.host
        self._client = httpx.AsyncClient(
            base_url=f"{'https' if url.secure else 'http'}://{host}:{url.port}{url.path}",
            verify=tls if tls is not None else True,
            trust_env=True,  # proxies from the environment, NO_PROXY honoured
            headers={"accept": "application/json", **(headers or {})},
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS, keepalive_expiry=KEEPALIVE_S),
            timeout=httpx.Timeout(None),  # the caller's deadline bounds each request
        )

    async def request_json(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30.0) -> tuple[int, Any]:
        """-> (HTTP status, decoded JSON body). Raises HttpError, or asyncio.TimeoutError
        when `timeout_s` passed (the request is cancelled: its connection closes)."""
        return await asyncio.wait_for(self._exchange(method, path, body, headers or {}), timeout_s)

    async def _exchange(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        target = path.lstrip("/")  # relative to base_url's path (".../v1" + "/completions")
        try:
            async with self._client.stream(method, target, json=body, headers=headers) as response:
                parts: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_RESPONSE:
                        raise HttpError(f"response over {MAX_RESPONSE} bytes")
                    parts.append(chunk)
                status, data = response.status_code, b"".join(parts)
        except httpx.HTTPError as exc:
            raise HttpError(f"HTTP exchange with {self.url} failed: {type(exc).__name__}: {exc}") from exc
        except ssl.SSLError as exc:
            raise HttpError(f"TLS with {self.url} failed: {exc}") from exc
        try:
            return status, json.loads(data) if data else None
        except ValueError as exc:
            raise HttpError(f"{self.url}{path} answered {status} with a body that is not JSON") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


async def request_json(
    url: EngineUrl, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None, timeout_s: float = 30.0,
) -> tuple[int, Any]:  # fmt: skip
    """One request on a client of its own (one-off calls and benches; an engine keeps a JsonClient)."""
    client = JsonClient(url, tls)
    try:
        return await client.request_json(method, path, body, headers, timeout_s)
    finally:
        await client.aclose()
