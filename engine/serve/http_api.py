"""The engine's HTTP/1.1 endpoint (OpenAI-compatible), served on the same port as the
msgpack protocol: the daemon looks at a connection's first bytes and hands HTTP ones
here (a msgpack frame starts with a 4-byte length, which can never read "POST"/"GET ").

Routes: `POST /v1/completions`, `GET /v1/models`, `GET /health`, and llama.cpp's
`POST /infill` and `POST /completion` (engine/serve/infill_api.py), `GET /metrics`
(Prometheus text, engine/serve/metrics.py). With a token, every route needs
`Authorization: Bearer <token>` (401 and nothing else otherwise); `/metrics` only when
not opened explicitly (`kspec engine --metrics-open`, for a scraper without the token). Bodies are
limited to MAX_BODY bytes; keep-alive is supported; a client that disconnects while its
request runs has it cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import h11

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.errors import EngineUnavailable, KspecError
from kspec.engine.serve.infill_api import infill_response, parse_infill
from kspec.engine.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from kspec.engine.serve.openai_api import ApiError, check_model, completion_response, error_body, models_response, parse_completion
from kspec.engine.freed_memory import return_freed_memory
from kspec.engine.serve.admission import Admission
from kspec.engine.serve.json_input import JsonInputError, parse_json
from kspec.engine.serve.auth import tokens_match

log = logging.getLogger("kspec.http")

HTTP_METHOD_PREFIXES = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI", b"PATC")
MAX_BODY = 16 * 1024 * 1024
READ_CHUNK = 65536
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection with no request for this long is closed
MAX_HEAD_BYTES = 64 * 1024  # request line and headers (once the token was shown)
RETURN_MEMORY_BYTES = 1024 * 1024  # after a body this large its memory is handed back to the system


def looks_like_http(first_bytes: bytes) -> bool:
    return first_bytes[:4] in HTTP_METHOD_PREFIXES


Answer = tuple[int, Any, dict[str, str]]  # HTTP status, JSON body, extra headers
CompleteFn = Callable[[CompletionRequest, str], Awaitable[tuple[CompletionResult, dict[str, str]]]]  # (request, document) -> (result, headers)


@dataclass
class HttpApi:
    """The endpoint's routes over what serves them: a completion function (given the
    request and its document key; returns the result and extra response headers), the
    model's name and readiness. The engine daemon and the Ray Serve ingress share it."""

    complete: CompleteFn
    model_name: Callable[[], Awaitable[str]]
    ready: Callable[[], Awaitable[tuple[bool, str]]]  # (ready, state message)
    token: str | None = None
    metrics: Callable[[], bytes] | None = None  # the Prometheus exposition; None: no /metrics
    metrics_open: bool = False  # /metrics without the token

    async def respond(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        path = path.split("?", 1)[0]
        if path == "/metrics" and self.metrics is not None and method == "GET" and self.metrics_open:
            return 200, self.metrics(), {"content-type": METRICS_CONTENT_TYPE}
        refused = self.refusal(method, path, headers)
        if refused is not None:
            return refused
        try:
            if path == "/health" and method == "GET":
                ready, state = await self.ready()
                return (200 if ready else 503), {"status": state}, {}
            if path == "/v1/models" and method == "GET":
                return 200, models_response(await self.model_name()), {}
            if path == "/v1/completions" and method == "POST":
                return await self._completions(body)
            if path == "/metrics" and method == "GET" and self.metrics is not None:
                return 200, self.metrics(), {"content-type": METRICS_CONTENT_TYPE}
            if path in ("/infill", "/completion") and method == "POST":
                return await self._infill(body, infill=path == "/infill")
            if path in ("/v1/models", "/v1/completions", "/health", "/infill", "/completion"):
                return 405, error_body(f"{method} is not allowed on {path}"), {}
            return 404, error_body(f"no route {path}; this server offers /v1/completions, /v1/models, /infill and /completion", "not_found_error"), {}
        except ApiError as exc:
            return exc.status, exc.body(), exc.headers

    def refusal(self, method: str, path: str, headers: dict[str, str]) -> Answer | None:
        """401 for a request without the right token, None when it may go on. Decided on the
        request's head: the transport reads no body before this says None."""
        if path.split("?", 1)[0] == "/metrics" and method == "GET" and self.metrics is not None and self.metrics_open:
            return None
        if tokens_match(self.token, bearer(headers.get("authorization", ""))):
            return None
        return 401, error_body("missing or wrong API token (Authorization: Bearer <token>)", "authentication_error"), {"www-authenticate": "Bearer"}

    async def _completions(self, body: bytes) -> Answer:
        parsed = parse_completion(_json(body))
        result, headers = await self._run(parsed.request, parsed.model, parsed.document)
        return 200, completion_response(result, result.model), headers

    async def _infill(self, body: bytes, infill: bool) -> Answer:
        parsed = parse_infill(_json(body), infill)
        if not parsed.generate:  # n_predict 0: a client warming the cache; kspec keeps the last prefix anyway
            return 200, infill_response(None, parsed), {}
        result, headers = await self._run(parsed.request, None, parsed.request.path)  # like llama.cpp, any `model` is the one served
        return 200, infill_response(result, parsed), headers

    async def _run(self, request: CompletionRequest, model: str | None, document: str) -> tuple[CompletionResult, dict[str, str]]:
        ready, state = await self.ready()
        if not ready:
            raise ApiError.of(EngineUnavailable(f"the engine is not ready: {state}"))
        check_model(model, await self.model_name())
        try:
            return await self.complete(request, document)
        except KspecError as exc:
            raise ApiError.of(exc) from exc


def _json(body: bytes) -> Any:
    if len(body) > MAX_BODY:
        raise ApiError(413, f"the body exceeds {MAX_BODY} bytes")
    try:
        return parse_json(body or b"null")
    except JsonInputError as exc:
        raise ApiError.invalid(f"the body is not valid JSON: {exc}") from exc


def bearer(value: str) -> str | None:
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


async def serve_http(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first_bytes: bytes, api: HttpApi, admission: Admission | None = None
) -> None:
    """HTTP/1.1 on one connection whose first bytes were already read. Until a request
    head shows the token (`admission`), the head must come whole within the admission's
    time and bytes, and a refused request's body is never read (401, then the
    connection is closed)."""
    limits = admission.limits if admission is not None else None
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.bytes if limits else MAX_HEAD_BYTES)
    connection.receive_data(first_bytes)
    trusted = admission is None
    try:
        while True:
            wait_s = IDLE_TIMEOUT_S if trusted or limits is None else limits.timeout_s
            request = await asyncio.wait_for(_next_event(connection, reader), wait_s)
            if not isinstance(request, h11.Request):
                return
            method, target = request.method.decode(), request.target.decode("latin-1")
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
            refused = api.refusal(method, target, headers)
            if refused is not None:
                _send_json(connection, writer, *refused)
                await writer.drain()
                return
            if not trusted and admission is not None:
                admission.authenticated(writer)
                trusted = True
            body = await _read_body(connection, reader)
            if body is None:
                status, payload, extra = 413, error_body(f"the body exceeds {MAX_BODY} bytes"), {}
            else:
                try:
                    answered = await _answer_unless_gone(api.respond(method, target, headers, body), reader, connection)
                except Exception:  # a bug: answered, and the connection lives on
                    log.exception("answering %s %s failed", method, target.split("?", 1)[0])
                    answered = 500, error_body("internal error (see the engine's log)", "server_error"), {}
                if answered is None:  # the client went away; its request was cancelled
                    return
                status, payload, extra = answered
            _send_json(connection, writer, status, payload, extra if body is not None else {})
            await writer.drain()
            closing = connection.our_state is h11.MUST_CLOSE or body is None
            if body is not None and len(body) > RETURN_MEMORY_BYTES:
                body = None
                return_freed_memory()  # the body's buffers are free now: give them back to the system
            if closing:
                return
            connection.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            _send_json(connection, writer, exc.error_status_hint, error_body(f"bad HTTP request: {exc}"))
    except (ConnectionError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await asyncio.wait_for(reader.read(READ_CHUNK), IDLE_TIMEOUT_S)
        connection.receive_data(data)  # b"" marks the end of the stream


async def _read_body(connection: h11.Connection, reader: asyncio.StreamReader) -> bytes | None:
    """The request body, or None when it is over MAX_BODY."""
    parts: list[bytes] = []
    size = 0
    while True:
        event = await _next_event(connection, reader)
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY:
                return None
            parts.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        else:
            raise h11.RemoteProtocolError("the connection ended inside a request body", error_status_hint=400)


async def _answer_unless_gone(job: Awaitable[Answer], reader: asyncio.StreamReader, connection: h11.Connection) -> Answer | None:
    """Runs `job`; if the client closes the connection meanwhile, cancels it -> None.
    Bytes that arrive meanwhile (a pipelined request) are kept for the next cycle."""
    task = asyncio.ensure_future(job)
    watcher = asyncio.ensure_future(reader.read(READ_CHUNK))
    try:
        while True:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            data = watcher.result()
            if not data:
                task.cancel()
                return None
            connection.receive_data(data)
            watcher = asyncio.ensure_future(reader.read(READ_CHUNK))
    finally:
        if watcher.done() and not watcher.cancelled() and watcher.exception() is None:
            connection.receive_data(watcher.result())  # read in the same turn the answer was ready
        watcher.cancel()
        if not task.done():
            task.cancel()


def compact_json(payload: Any) -> bytes:
    """JSON as llama.cpp's server writes it: no spaces after `,` and `:`. llama.vim accepts an
    answer only where `"content"\\s*:"` matches (no space between the colon and the quote)."""
    return json.dumps(payload, separators=(",", ":")).encode()


def _send_json(connection: h11.Connection, writer: asyncio.StreamWriter, status: int, payload: Any, extra: dict[str, str] | None = None) -> None:
    """A JSON answer, or bytes as they are (their content-type in `extra`)."""
    body = payload if isinstance(payload, bytes) else compact_json(payload)
    extra = dict(extra or {})
    headers = [("content-type", extra.pop("content-type", "application/json")), ("content-length", str(len(body))), *extra.items()]
    writer.write(connection.send(h11.Response(status_code=status, headers=headers)))
    writer.write(connection.send(h11.Data(data=body)))
    writer.write(connection.send(h11.EndOfMessage()))
