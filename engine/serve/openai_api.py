"""The OpenAI-compatible completions API, as plain data: request bodies to
CompletionRequests and results to response bodies. No I/O and no torch here; the HTTP
transport (engine/serve/http_api.py), the Ray Serve ingress (engine/serve/cluster.py) and
the language server's remote backend (lsp_server/remote_backend.py) share it.

`POST /v1/completions` fields: prompt (the text before the cursor), suffix (after it),
n (-> k branches), max_tokens, temperature, top_p, stop, seed, user. Like any
OpenAI-compatible server the choices are the model's raw continuations (ended by
`stop`, end of text or `max_tokens`, no line rules, no trimming); temperature 0 gives
the n most likely *distinct* continuations (greedy after n different first tokens)
rather than n copies of one. kspec's own extensions, all optional, sit under "kspec":
language, path, deadline_ms, postprocess (true: kspec's cursor rules and tree-sitter
trim/check/rank, as the language server shows them; fewer than n choices may remain).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kspec.engine.api import MAX_K, MAX_NEW_TOKENS, MAX_STOP_CHARS, CompletionRequest, CompletionResult, mode_for_temperature
from kspec.engine.errors import InputError, describe

MAX_API_STOPS = 4  # as OpenAI's API (the engine takes up to MAX_STOPS)
DEFAULT_MAX_TOKENS = 16  # OpenAI's default
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default
DEFAULT_DEADLINE_MS = 30000.0
UNSUPPORTED = ("echo", "logprobs", "stream", "best_of", "logit_bias", "presence_penalty", "frequency_penalty")


class ApiError(Exception):
    """A request the API refuses: HTTP status and an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = InputError.http_type, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}  # extra response headers

    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> "ApiError":
        """A request the API refuses as an InputError would be refused (400, invalid_request_error)."""
        return cls(InputError.http_status, message, param, InputError.http_type)

    @classmethod
    def of(cls, error: BaseException, headers: dict[str, str] | None = None) -> "ApiError":
        """The answer to an engine error: its HTTP status and type (kspec.engine.errors)."""
        answer = describe(error)
        return cls(answer.http_status, answer.message, kind=answer.http_type, headers=headers)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param)


def error_body(message: str, kind: str = InputError.http_type, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@dataclass(frozen=True)
class ParsedCompletion:
    request: CompletionRequest
    model: str | None  # as asked; None: whatever the server serves
    document: str  # affinity key: requests with the same key go to the same replica


def _integer(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError.invalid(f"'{name}' must be an integer between {low} and {high}", name)
    return value


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise ApiError.invalid(f"'{name}' must be a number between {low:g} and {high:g}", name)
    return float(value)


def _text(body: dict[str, Any], name: str, default: str = "") -> str:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ApiError.invalid(f"'{name}' must be a string", name)
    return value


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError.invalid("'prompt' must be a string (one prompt per request)", "prompt")
    return prompt


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_API_STOPS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise ApiError.invalid(f"'stop' must be a string or a list of up to {MAX_API_STOPS} non-empty strings", "stop")
    return tuple(stops)


def parse_completion(body: Any) -> ParsedCompletion:
    """A `POST /v1/completions` JSON body -> the engine request (raises ApiError)."""
    if not isinstance(body, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    for name in UNSUPPORTED:
        value = body.get(name)
        if value not in (None, False, 0) and not (name == "best_of" and value == body.get("n", 1)):
            raise ApiError.invalid(f"'{name}' is not supported by this server", name)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError.invalid("'model' must be a string", "model")
    extensions = body.get("kspec") or {}
    if not isinstance(extensions, dict):
        raise ApiError.invalid("'kspec' must be an object", "kspec")
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, 2.0)
    postprocess = extensions.get("postprocess", False)
    if not isinstance(postprocess, bool):
        raise ApiError.invalid("'kspec.postprocess' must be true or false", "kspec.postprocess")
    request = CompletionRequest(
        prefix=_prompt(body),
        suffix=_text(body, "suffix"),
        language=_text(extensions, "language"),
        path=_text(extensions, "path"),
        k=_integer(body, "n", 1, 1, MAX_K),
        max_tokens=_integer(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, MAX_NEW_TOKENS),
        mode=mode_for_temperature(temperature),
        temperature=temperature,
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        seed=_integer(body, "seed", 0, 0, 2**63 - 1),
        deadline_ms=_number(extensions, "deadline_ms", DEFAULT_DEADLINE_MS, 1.0, 600000.0),
        raw=not postprocess,
        stop=_stops(body),
        cursor_rules=postprocess,
    )
    document = _text(extensions, "document") or _text(body, "user")
    return ParsedCompletion(request, model, document)


def finish_reason(reason: str) -> str:
    """Ours ("stop", "eos", "length", "deadline", "cancelled") -> OpenAI's ("stop", "length")."""
    return "stop" if reason in ("stop", "eos") else "length"


def completion_response(result: CompletionResult, model: str, created: int | None = None) -> dict[str, Any]:
    prompt_tokens = int(result.timing_ms.get("prompt_tokens", 0))
    completion_tokens = sum(c.n_tokens for c in result.completions)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {"text": c.text, "index": index, "logprobs": None, "finish_reason": finish_reason(c.finish_reason)}
            for index, c in enumerate(result.completions)
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


def models_response(model: str, created: int = 0) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "kspec"}]}


def check_model(asked: str | None, served: str) -> None:
    """A request naming another model is refused (404), as OpenAI-compatible servers do."""
    if asked is not None and asked not in ("", served):
        raise ApiError(404, f"the model {asked!r} does not exist; this server serves {served!r}", "model", "not_found_error")
