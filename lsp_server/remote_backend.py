"""The language server on top of an OpenAI-compatible engine a team already runs
(vLLM, SGLang, llama.cpp server, or kspec's own `/v1/completions`).

The server asks for `n = k` raw continuations (`prompt` = text before the cursor,
`suffix` = after it, or both put into the model's fill-in-the-middle template by this
client when the server ignores `suffix`); kspec then applies its own cursor rules (end
of line / block), tree-sitter trimming, checks and ranking, and the language server's
typeahead cache, exactly as for its own engine. Without log-probabilities from the
server, its order ranks alternatives of equal quality. The document's URI is sent as
`user`, so a load balancer can keep a document on one replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kspec.engine.api import CompletionRequest, CompletionResult, EarlyAnswer
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable, from_status
from kspec.engine.decode.stopping import rule_for_cursor
from kspec.engine.syntax import Candidate, detect_language, postprocess
from kspec.lsp_server.http_client import HttpError, request_json
from kspec.engine.serve.protocol import EngineUrl, client_tls, read_token
from kspec.engine.serve.status import ERROR, LOADING, READY, Status

log = logging.getLogger("kspec.remote")

FIM_SUFFIX_FIELD = "suffix"  # send the suffix in the API's `suffix` field


@dataclass(frozen=True)
class RemoteOptions:
    url: EngineUrl  # http(s)://HOST:PORT/v1
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    ca_file: Path | None = None
    fim: str = FIM_SUFFIX_FIELD  # or a template with {prefix} and {suffix}, e.g. "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.url.is_http:
            raise ValueError(f"an OpenAI-compatible engine needs an http:// or https:// URL, got {self.url}")
        if self.fim != FIM_SUFFIX_FIELD and ("{prefix}" not in self.fim or "{suffix}" not in self.fim):
            raise ValueError("remoteFim must be 'suffix' or a template containing {prefix} and {suffix}")


def api_key_from(path: str | None, variables: tuple[str, ...]) -> str | None:
    """The token / API key: from a file when one is named (InputError when it cannot be
    read or is empty), else the first of these environment variables that is set."""
    if path:
        return read_token(path)
    return next((os.environ[name] for name in variables if os.environ.get(name)), None)


class OpenAIEngine:
    """EngineClient for an OpenAI-compatible HTTP engine."""

    def __init__(self, options: RemoteOptions, on_status: Callable[[Status], None]):
        self.options = options
        self._on_status = on_status
        self._tls = client_tls(options.ca_file) if options.url.secure else None
        self._status = Status(LOADING, f"connecting to {options.url}", model=options.model or "")
        self._model: str | None = options.model

    @property
    def status(self) -> Status:
        return self._status

    def _set_status(self, status: Status) -> None:
        self._status = status
        self._on_status(status)

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}

    async def start(self) -> None:
        """Checks the server (and picks its model when none is set); reports the outcome."""
        try:
            status, body = await request_json(self.options.url, "GET", "/models", headers=self._headers(), tls=self._tls, timeout_s=self.options.connect_timeout_s)
        except (HttpError, asyncio.TimeoutError, OSError) as exc:
            self._set_status(Status(ERROR, f"cannot reach the engine at {self.options.url}: {exc or 'timed out'}"))
            return
        if status != 200:
            self._set_status(Status(ERROR, f"the engine at {self.options.url} answered /models with {status}: {_message(body)}"))
            return
        served = [m.get("id") for m in (body or {}).get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if self._model is None:
            if not served:
                self._set_status(Status(ERROR, f"the engine at {self.options.url} lists no model; set remoteModel"))
                return
            self._model = served[0]
        elif served and self._model not in served:
            self._set_status(Status(ERROR, f"the engine at {self.options.url} serves {', '.join(served)}, not {self._model!r}"))
            return
        self._set_status(Status(READY, "ready", model=self._model))

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:  # whole answers only
        if self._model is None:
            raise EngineUnavailable(self._status.message or "the remote engine is not connected")
        rule = rule_for_cursor(request.prefix, request.suffix, request.stop)
        body: dict[str, Any] = {
            "model": self._model,
            "n": request.k,
            "max_tokens": request.max_tokens,
            "temperature": request.sampling_temperature,
            "top_p": request.top_p,
            "seed": request.seed,
            "user": request.path or "",
        }
        if rule.single_line or rule.stop_strings:
            body["stop"] = (["\n"] if rule.single_line else []) + list(rule.stop_strings)[:3]
        if self.options.fim == FIM_SUFFIX_FIELD:
            body["prompt"], body["suffix"] = request.prefix, request.suffix
        else:
            body["prompt"] = self.options.fim.replace("{prefix}", request.prefix).replace("{suffix}", request.suffix)
        try:
            status, reply = await request_json(self.options.url, "POST", "/completions", body, self._headers(), self._tls, request.deadline_ms / 1000)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"the engine at {self.options.url} did not answer within {request.deadline_ms:.0f} ms") from None
        except HttpError as exc:
            raise EngineUnavailable(str(exc)) from exc
        if status != 200:
            raise from_status(status, f"the engine at {self.options.url} answered {status}: {_message(reply)}")
        return self._result(request, rule, reply)

    def _result(self, request: CompletionRequest, rule, reply: Any) -> CompletionResult:
        choices = (reply or {}).get("choices")
        if not isinstance(choices, list):
            raise EngineUnavailable("malformed reply from the engine: no 'choices'")
        candidates = []
        for rank, choice in enumerate(sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)):
            text = choice.get("text") if isinstance(choice, dict) else None
            if not isinstance(text, str):
                continue
            text, stopped = rule.cut(text)
            reason = "stop" if stopped or choice.get("finish_reason") == "stop" else "length"
            if text:
                candidates.append(Candidate(text, -1e-3 * rank, 0, reason))  # the server's order breaks ties
        language = detect_language(request.language, request.path)
        completions = postprocess(request.prefix, request.suffix, language, candidates, raw=request.raw)
        return CompletionResult(completions, str((reply or {}).get("model") or self._model), {})

    def close(self) -> None:
        pass  # no connection is kept between requests

    def join(self, timeout_s: float) -> bool:
        return True


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:200]
    return str(body)[:200]
