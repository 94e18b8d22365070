"""The language server on top of an OpenAI-compatible engine a team already runs
(vLLM, SGLang, llama.cpp server, or kspec's own `/v1/completions`).

The server asks for `n = k` raw continuations (`prompt` = text before the cursor and
the text after it as the `suffix` field or inside the model's fill-in-the-middle
template, as `remoteFim` says: lsp_server/fim.py); kspec then applies its own cursor rules (end
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

from kspec.engine.api import Completion, CompletionRequest, CompletionResult, EarlyAnswer
from kspec.engine.context_prompt import comment_block
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable, InputError, KspecError, from_status
from kspec.engine.decode.stopping import rule_for_cursor
from kspec.engine.syntax import detect_language, postprocess
from kspec.lsp_server import fim
from kspec.lsp_server.http_client import HttpError, JsonClient
from kspec.engine.serve.auth import read_token
from kspec.engine.serve.network import EngineUrl, client_tls
from kspec.engine.serve.status import ERROR, LOADING, READY, Status

log = logging.getLogger("kspec.remote")

@dataclass(frozen=True)
class RemoteOptions:
    url: EngineUrl  # http(s)://HOST:PORT/v1
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    ca_file: Path | None = None
    fim: str = fim.AUTO  # or "suffix", or a template with {prefix} and {suffix} (lsp_server/fim.py)
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.url.is_http:
            raise ValueError(f"an OpenAI-compatible engine needs an http:// or https:// URL, got {self.url}")
        problem = fim.check_setting(self.fim)
        if problem:
            raise ValueError(f"remoteFim {problem}")


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
        self._http: JsonClient | None = None  # made on first use, on the loop that uses it
        self._status = Status(LOADING, f"connecting to {options.url}", model=options.model or "")
        self._model: str | None = options.model
        self._fim = fim.resolve(options.fim, options.model or "")  # resolved again against /models in start()

    @property
    def status(self) -> Status:
        return self._status

    def _set_status(self, status: Status) -> None:
        self._status = status
        self._on_status(status)

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}

    def _client(self) -> JsonClient:
        """The pooled keep-alive client of this engine (one TCP/TLS handshake, not one per keystroke)."""
        if self._http is None:
            self._http = JsonClient(self.options.url, self._tls)
        return self._http

    async def start(self) -> None:
        """Checks the server (and picks its model when none is set); reports the outcome."""
        try:
            status, body = await self._client().request_json("GET", "/models", headers=self._headers(), timeout_s=self.options.connect_timeout_s)
        except (HttpError, asyncio.TimeoutError, OSError) as exc:
            self._set_status(Status(ERROR, f"cannot reach the engine at {self.options.url}: {exc or 'timed out'}"))
            return
        if status != 200:
            self._set_status(Status(ERROR, f"the engine at {self.options.url} answered /models with {status}: {_message(body)}{_advice(status)}"))
            return
        entries = {m["id"]: m for m in (body or {}).get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)}
        served = list(entries)
        if self._model is None:
            if not served:
                self._set_status(Status(ERROR, f"the engine at {self.options.url} lists no model; set remoteModel"))
                return
            self._model = served[0]
        elif served and self._model not in served:
            self._set_status(Status(ERROR, f"the engine at {self.options.url} serves {', '.join(served)}, not {self._model!r}"))
            return
        entry = entries.get(self._model, {})
        self._fim = fim.resolve(self.options.fim, self._model, str(entry.get("root") or ""), str(entry.get("owned_by") or ""))
        log.info("remote FIM for %s: %s", self._model, self._fim.kind)
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
        status, reply = await self._post(body, request)
        if status != 200 and self._fim.kind == fim.SUFFIX_FIELD and fim.refuses_suffix(status, _message(reply)):
            self._suffix_refused(status, _message(reply))
            status, reply = await self._post(body, request)  # once more, as the server takes it now
        if status != 200:
            raise self._error(status, reply)
        return self._result(request, rule, reply)

    async def _post(self, body: dict[str, Any], request: CompletionRequest) -> tuple[int, Any]:
        prefix = comment_block(request.context, request.path, request.language) + request.prefix  # other files first
        body = {**body, **self._fim.fields(prefix, request.suffix)}
        try:
            return await self._client().request_json("POST", "/completions", body, self._headers(), request.deadline_ms / 1000)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"the engine at {self.options.url} did not answer within {request.deadline_ms:.0f} ms") from None
        except HttpError as exc:
            raise EngineUnavailable(str(exc)) from exc

    def _suffix_refused(self, status: int, message: str) -> None:
        """The server refuses the `suffix` field (vLLM: 400). With remoteFim "auto", this
        server gets the text before the cursor alone from now on; with "suffix", nothing works."""
        advice = "set remoteFim to the model's fill-in-the-middle template, e.g. <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"
        if self.options.fim == fim.SUFFIX_FIELD:
            self._set_status(Status(ERROR, f"the engine at {self.options.url} refuses the `suffix` field ({status}: {message}); {advice}"))
            raise InputError(f"the engine at {self.options.url} refuses `suffix`: {advice}")
        self._fim = fim.FimMode(fim.PREFIX_ONLY)
        note = f"ready; {self._model} refuses `suffix` and its family is unknown, so completions see only the text before the cursor: {advice}"
        log.warning("%s", note)
        self._set_status(Status(READY, note, model=self._model or ""))

    def _error(self, status: int, reply: Any) -> KspecError:
        """The error for a refused request; refusals that every keystroke would repeat also go to the status."""
        message = f"the engine at {self.options.url} answered {status}: {_message(reply)}"
        if _advice(status):
            self._set_status(Status(ERROR, message + _advice(status)))
        return from_status(status, message)

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
                candidates.append(Completion(text, logprob=-1e-3 * rank, n_tokens=0, finish_reason=reason))  # the server's order breaks ties
        language = detect_language(request.language, request.path)
        completions = postprocess(request.prefix, request.suffix, language, candidates, raw=request.raw, outside=frozenset(request.outside_names))
        return CompletionResult(completions, str((reply or {}).get("model") or self._model), {})

    def close(self) -> None:
        """Closes the pooled connections (at once when no loop runs any more)."""
        client, self._http = self._http, None
        if client is None:
            return
        try:
            self._closing = asyncio.get_running_loop().create_task(client.aclose())  # kept: a task nobody holds may vanish
        except RuntimeError:  # no running loop: the process is ending, its sockets go with it
            pass

    def join(self, timeout_s: float) -> bool:
        return True


def _advice(status: int) -> str:
    """What to set for a refusal that every request would meet again ("" for others)."""
    if status in (401, 403):
        return "; check engineTokenFile or $OPENAI_API_KEY / $KSPEC_ENGINE_TOKEN"
    if status == 404:
        return "; check remoteModel and that engineUrl ends in /v1"
    return ""


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))[:200]
    return str(body)[:200]
