"""The `openai` backend's HTTP client: one keep-alive connection for successive requests
(not one TCP/TLS handshake per keystroke), proxies from HTTP(S)_PROXY with NO_PROXY
honoured, and a cancelled request that closes its own connection only."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_standin import VllmLike

from kspec.engine.api import CompletionRequest
from kspec.engine.serve.network import parse_engine_url
from kspec.lsp_server.http_client import JsonClient
from kspec.lsp_server.remote_backend import OpenAIEngine, RemoteOptions

REQUEST = CompletionRequest(prefix="x = ", suffix="", k=1, max_tokens=4, raw=True)
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture
def servers(monkeypatch) -> Iterator[Any]:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    started: list[VllmLike] = []

    def start(model: str = "Qwen/Qwen2.5-Coder-1.5B") -> VllmLike:
        started.append(VllmLike(model))
        return started[-1]

    yield start
    for server in started:
        server.close()


async def test_successive_requests_share_one_connection(servers) -> None:
    server = servers()
    engine = OpenAIEngine(RemoteOptions(parse_engine_url(server.url)), lambda status: None)
    await engine.start()
    for _ in range(5):
        await engine.complete(REQUEST)
    assert len(server.requests) == 6 and len({port for _, _, port in server.requests}) == 1
    engine.close()


async def test_proxy_from_the_environment_and_no_proxy(servers, monkeypatch) -> None:
    target, proxy = servers(), servers()
    monkeypatch.setenv("HTTP_PROXY", proxy.url.rsplit("/v1", 1)[0])
    client = JsonClient(parse_engine_url(target.url))
    status, _ = await client.request_json("GET", "/models")
    await client.aclose()
    assert status == 200 and target.requests == []
    assert proxy.requests[0][:2] == ("GET", f"{target.url}/models")  # absolute form: a forward proxy's request
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client = JsonClient(parse_engine_url(target.url))
    await client.request_json("GET", "/models")
    await client.aclose()
    assert target.requests[0][:2] == ("GET", "/v1/models") and len(proxy.requests) == 1


async def test_a_cancelled_request_closes_only_its_connection(servers) -> None:
    server = servers()
    client = JsonClient(parse_engine_url(server.url))
    await client.request_json("GET", "/models")  # connection A, back in the pool
    server.gate = threading.Event()  # the next POST waits
    slow = asyncio.ensure_future(client.request_json("POST", "/completions", {"prompt": "x", "n": 1}))  # on A
    assert await asyncio.to_thread(server.post_arrived.wait, 30)
    fast = await client.request_json("GET", "/models")  # meanwhile on connection B
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    server.gate.set()
    again = await client.request_json("GET", "/models")
    await client.aclose()
    assert fast[0] == again[0] == 200
    ports = [port for _, _, port in server.requests]
    assert ports[0] == ports[1] != ports[2]
    assert ports[3] == ports[2]  # B stayed pooled; A, the cancelled request's, was closed and not reused
