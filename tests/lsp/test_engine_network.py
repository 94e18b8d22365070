"""The engine as a network service, end to end: a real `kspec engine --listen` process
(small random model) reached over TCP, TLS and HTTP; token refusal; two clients at once;
cancellation inside a batch; the OpenAI-compatible endpoint with a plain HTTP client; the
language server on the remote backends."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lsp_harness import FAST, REPO, editor_session, server_env

from kspec.engine.api import CompletionRequest
from kspec.lsp_server.engine_client import DaemonEngine, DaemonOptions
from kspec.engine.serve.openai_api import parse_completion
from kspec.engine.config import EngineConfig
from kspec.engine.serve.network import parse_engine_url
from kspec.engine.serve.wire import PROTOCOL_VERSION, Failed, Hello, decode, read_frame, send
from kspec.engine.errors import EngineUnavailable

TOKEN = "team-token-123"
START_TIMEOUT_S = 90.0


@dataclass
class Served:
    process: subprocess.Popen
    host: str
    port: int
    token_file: Path
    tls: ssl.SSLContext | None = None
    ca_file: Path | None = None


# The random model's next-token distributions are nearly flat: where diverse branches split
# (engine/decode/forks.py) compares many near-equal ratios, which a batch's float rounding can
# reorder. These tests compare a batch with requests alone, so both sides start every branch
# with its own first token (fork ratio 0), as greedy decoding does not depend on such near-ties.
NO_FORKS = ("--fork-ratio", "0")


def _start_engine(model_dir: Path, folder: Path, *extra: str) -> Served:
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    command = [sys.executable, "-m", "kspec.cli.main", "engine", "--model", str(model_dir), "--listen", "127.0.0.1:0", "--token-file", str(token_file), *extra]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=server_env(folder), cwd=REPO)
    deadline = time.monotonic() + START_TIMEOUT_S
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline().decode()
        if not line:
            raise AssertionError(f"the engine exited with {process.wait()}")
        match = re.search(r"listening on \w+://127\.0\.0\.1:(\d+)", line)
        if match:
            # keep draining stderr so the engine never blocks on a full pipe
            threading_drain(process)
            return Served(process, "127.0.0.1", int(match.group(1)), token_file)
    process.kill()
    raise AssertionError("the engine did not start listening")


def threading_drain(process: subprocess.Popen) -> None:
    import threading

    threading.Thread(target=lambda: [None for _ in iter(process.stderr.readline, b"")], daemon=True).start()


def _stop(served: Served) -> None:
    served.process.terminate()
    try:
        served.process.wait(30)
    except subprocess.TimeoutExpired:
        served.process.kill()


@pytest.fixture(scope="module")
def engine_tcp(model_dir: Path, tmp_path_factory) -> Iterator[Served]:
    served = _start_engine(model_dir, tmp_path_factory.mktemp("tcp"), *NO_FORKS)
    yield served
    _stop(served)


@pytest.fixture(scope="module")
def engine_tls(model_dir: Path, tmp_path_factory) -> Iterator[Served]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    served = _start_engine(model_dir, folder, "--tls-cert", str(cert), "--tls-key", str(key), *NO_FORKS)
    served.tls, served.ca_file = ssl.create_default_context(cafile=str(cert)), cert
    yield served
    _stop(served)


def _client(served: Served, token: str | None = TOKEN, scheme: str = "tcp") -> DaemonEngine:
    url = parse_engine_url(f"{scheme}://{served.host}:{served.port}")
    options = DaemonOptions(config=EngineConfig(), url=url, token=token, ca_file=served.ca_file, connect_timeout_s=START_TIMEOUT_S)
    return DaemonEngine(options, lambda status: None)


def _http(served: Served, method: str, path: str, body: object = None, token: str | None = TOKEN) -> tuple[int, dict]:
    status, raw = _http_raw(served, method, path, body, token)
    return status, json.loads(raw or b"null")


def _http_raw(served: Served, method: str, path: str, body: object = None, token: str | None = TOKEN) -> tuple[int, bytes]:
    """The status and the body's bytes as the server wrote them."""
    if served.tls is not None:
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(served.host, served.port, context=served.tls, timeout=120)
    else:
        connection = http.client.HTTPConnection(served.host, served.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _wait_ready(served: Served) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while _http(served, "GET", "/health")[0] != 200:
        assert time.monotonic() < deadline, "the engine never became ready"


def _request(prefix: str, **fields) -> CompletionRequest:
    return CompletionRequest(prefix=prefix, **{"k": 2, "max_tokens": 8, "raw": True, "cursor_rules": False, "deadline_ms": 60000.0, **fields})


PREFIXES = ["def add(a, b):\n    return", "for item in items:\n    print(", "class Point:\n    def __init__(self", "import os\npath = os."]


async def test_wrong_or_missing_token_gets_only_a_refusal(engine_tcp: Served) -> None:
    for token in (None, "guess"):
        reader, writer = await asyncio.open_connection(engine_tcp.host, engine_tcp.port)
        send(writer, Hello(PROTOCOL_VERSION, token=token))
        reply = await asyncio.wait_for(read_frame(reader), 30)
        assert reply is not None and decode(reply) == Failed(None, "protocol", "bad token")
        assert await asyncio.wait_for(read_frame(reader), 30) is None  # and the connection is closed
        writer.close()
    with pytest.raises(EngineUnavailable, match="refused"):
        await _client(engine_tcp, token="guess").complete(_request("x = 1"))
    for token in (None, "guess"):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/health")):
            status, body = await asyncio.to_thread(_http, engine_tcp, method, path, {"prompt": "x"}, token)
            assert status == 401 and body["error"]["type"] == "authentication_error" and "choices" not in body


@pytest.fixture(scope="module")
def alone_engine(model_dir: Path):
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    return CompletionEngine.load(EngineConfig(model=str(model_dir), dtype="float32", progress=False, fit_to_machine=False, fork_ratio=0.0))


async def test_two_clients_at_once_get_what_each_gets_alone(engine_tcp: Served, alone_engine) -> None:
    requests = [_request(prefix, k=1 + i % 3, max_tokens=6 + 2 * i) for i, prefix in enumerate(PREFIXES)]
    alone = [[c.text for c in alone_engine.complete(r).completions] for r in requests]
    first, second = _client(engine_tcp), _client(engine_tcp)
    await first.start()
    await second.start()
    try:
        jobs = [(first if i % 2 == 0 else second).complete(r) for i, r in enumerate(requests)]
        results = await asyncio.wait_for(asyncio.gather(*jobs), 120)
    finally:
        first.close()
        second.close()
    assert [[c.text for c in result.completions] for result in results] == alone


async def test_cancelling_one_request_of_a_batch_leaves_the_others_correct(engine_tcp: Served, alone_engine) -> None:
    short = _request(PREFIXES[1], k=2, max_tokens=12)
    expected = [c.text for c in alone_engine.complete(short).completions]
    first, second = _client(engine_tcp), _client(engine_tcp)
    await first.start()
    await second.start()
    try:
        long_job = asyncio.ensure_future(first.complete(_request(PREFIXES[0], k=4, max_tokens=500)))
        result = await asyncio.wait_for(second.complete(short), 120)  # decoded alongside the long one
        assert [c.text for c in result.completions] == expected
        assert not long_job.done()
        long_job.cancel()  # sends cancel(id): it leaves the batch at its next round
        with pytest.raises(asyncio.CancelledError):
            await long_job
        again = await asyncio.wait_for(first.complete(short), 120)  # the connection is still good
        assert [c.text for c in again.completions] == expected
    finally:
        first.close()
        second.close()


def test_openai_endpoint_with_a_plain_http_client(engine_tcp: Served, alone_engine) -> None:
    _wait_ready(engine_tcp)
    status, models = _http(engine_tcp, "GET", "/v1/models")
    assert status == 200 and models["object"] == "list"
    model = models["data"][0]["id"]
    body = {"model": model, "prompt": PREFIXES[0], "suffix": "\n\nprint(add(1, 2))\n", "n": 3, "max_tokens": 10, "temperature": 0, "stop": ["\n\n"]}
    status, reply = _http(engine_tcp, "POST", "/v1/completions", body)
    assert status == 200, reply
    assert reply["object"] == "text_completion" and reply["model"] == model
    expected = alone_engine.complete(parse_completion(body).request)
    assert [c["text"] for c in reply["choices"]] == [c.text for c in expected.completions]
    assert [c["index"] for c in reply["choices"]] == list(range(len(reply["choices"])))
    assert all("\n\n" not in c["text"] and c["finish_reason"] in ("stop", "length") for c in reply["choices"])
    assert reply["usage"]["prompt_tokens"] > 0 and reply["usage"]["total_tokens"] >= reply["usage"]["prompt_tokens"]
    for bad, status_expected in (
        ({"prompt": "x", "n": 0}, 400),
        ({"prompt": "x", "stream": True}, 400),
        ({"prompt": 3}, 400),
        ({"prompt": "x", "model": "gpt-4"}, 404),
    ):
        status, reply = _http(engine_tcp, "POST", "/v1/completions", bad)
        assert status == status_expected and reply["error"]["message"], bad
    assert _http(engine_tcp, "GET", "/v1/completions")[0] == 405
    assert _http(engine_tcp, "GET", "/nowhere")[0] == 404


async def test_tls_for_the_protocol_and_http(engine_tls: Served, alone_engine) -> None:
    request = _request(PREFIXES[2])
    client = _client(engine_tls, scheme="tls")
    await client.start()
    try:
        result = await asyncio.wait_for(client.complete(request), 120)
    finally:
        client.close()
    assert [c.text for c in result.completions] == [c.text for c in alone_engine.complete(request).completions]
    status, _ = await asyncio.to_thread(_http, engine_tls, "GET", "/v1/models")
    assert status == 200
    untrusted = DaemonEngine(DaemonOptions(url=parse_engine_url(f"tls://127.0.0.1:{engine_tls.port}"), token=TOKEN, connect_timeout_s=30), lambda s: None)
    with pytest.raises(EngineUnavailable, match="TLS|certificate"):
        await untrusted.complete(request)
    untrusted.close()


@pytest.mark.parametrize("backend", ["openai", "remote"])
async def test_language_server_on_a_network_engine(engine_tcp: Served, backend: str) -> None:
    await asyncio.to_thread(_wait_ready, engine_tcp)
    url = f"http://127.0.0.1:{engine_tcp.port}/v1" if backend == "openai" else f"tcp://127.0.0.1:{engine_tcp.port}"
    args = ("--engine-url", url, "--engine-token-file", str(engine_tcp.token_file))
    async with editor_session(FAST, args=args) as editor:
        status = await editor.ready()
        assert status["state"] == "ready"
        uri = "file:///work/remote.py"
        editor.open(uri, "def total(values):\n    return sum(\n")
        items = await editor.inline(uri, 1, 15)
        assert items and all(item.insert_text for item in items)
        stats = await editor.stats()
        assert stats["engine_calls"] >= 1 and stats["errors"] == 0


async def test_language_server_reports_a_wrong_token(engine_tcp: Served, tmp_path: Path) -> None:
    bad = tmp_path / "bad-token"
    bad.write_text("guess")
    args = ("--engine-url", f"http://127.0.0.1:{engine_tcp.port}/v1", "--engine-token-file", str(bad))
    async with editor_session(FAST, args=args) as editor:
        message = await editor.wait_status(lambda s: s["state"] == "error")
        assert "401" in message["message"]


def test_bench_hop_times_the_same_request_both_ways(engine_tcp: Served, model_dir: Path) -> None:
    from kspec.engine.config import EngineConfig
    from kspec.bench.serve import bench_hop

    _wait_ready(engine_tcp)
    report = bench_hop(EngineConfig(model=str(model_dir), progress=False), f"http://127.0.0.1:{engine_tcp.port}/v1", TOKEN, samples=1)
    for name in ("n=1 max_tokens=1", "n=2 max_tokens=16"):
        row = report[name]
        assert row["in_process_ms"] > 0 and row["endpoint_ms"] > 0 and row["samples"] == 1
        assert row["overhead_ms"] == round(row["endpoint_ms"] - row["in_process_ms"], 1)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_a_flood_without_the_token_costs_little_and_starves_nobody(engine_tcp: Served) -> None:
    """150 connections that announce 16 MB bodies without a token and send 2 MiB each
    (read before the token is checked, such bodies would cost GBs)."""
    await asyncio.to_thread(_wait_ready, engine_tcp)
    pid = engine_tcp.process.pid
    before = _rss_mb(pid)

    async def unauthenticated() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(engine_tcp.host, engine_tcp.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n")
        try:
            for _ in range(32):
                writer.write(b"y" * 65536)
                await writer.drain()
        except ConnectionError:  # refused after the head: the body is not wanted
            pass
        return writer

    writers = await asyncio.gather(*(unauthenticated() for _ in range(150)))
    try:
        grown = _rss_mb(pid) - before
        body = {"prompt": PREFIXES[1], "max_tokens": 4, "temperature": 0}
        status, reply = await asyncio.to_thread(_http, engine_tcp, "POST", "/v1/completions", body)
        assert status == 200, reply  # a real client is answered meanwhile
        assert grown <= 50, f"the engine grew by {grown:.0f} MB"
    finally:
        for writer in writers:
            writer.close()
