"""What the client is told of the engine and of its requests (`$/kspec/status`): the engine's
state, model and last latency, and `activity` (BUSY while any engine work runs: a request waited
for, decoding on after an early answer, unattended or retried; else how the last request ended),
so that "nothing came" can be told from "still working" and "gave up at the deadline".
`decoding` lists the documents whose engine work runs, and `alternatives` how many distinct
alternatives the last final answer had of the k asked for."""

from __future__ import annotations

import asyncio

import os
from typing import Any, Callable

import msgspec

from kspec.engine.serve.status import READY, Status
from kspec.lsp_server.settings import camel

STATUS_METHOD = "$/kspec/status"
IDLE, BUSY, TIMED_OUT = "idle", "busy", "timedOut"
# `prompt` in the status: its name -> the engine's timing_ms key
PROMPT_TIMING = {"tokens": "prompt_tokens", "reusedTokens": "reused_prompt_tokens", "prefillMs": "prefill"}


class StatusReport:
    """The last status and activity, told through `notify` (the notification's params) with what
    `extras` adds (acceptance totals, the daemon's log file)."""

    def __init__(self, notify: Callable[[dict[str, Any]], None], extras: Callable[[], dict[str, Any]]) -> None:
        self._notify = notify
        self._extras = extras
        self.status = Status("loading", "starting")
        self.activity = IDLE
        self.outcome = IDLE  # how the last request ended (IDLE or TIMED_OUT): the activity once no work runs
        self.work: dict[str, int] = {}  # document URI -> its engine jobs running now
        self.waiting: dict[str, int] = {}  # document URI -> requests awaiting its jobs (they tell the end)
        self.alternatives: dict[str, int] | None = None  # the last final answer: {"count", "k"}
        self.context_tokens = 0  # of other files' context in the last answer's prompt
        self.prompt: dict[str, float] = {}  # the last answer's prompt: tokens, reusedTokens (from the prefix cache), prefillMs
        self.closed = False

    def tell(self) -> None:
        if not self.closed:
            told = {**status_for_editor(self.status), "serverPid": os.getpid(), "activity": self.activity, "decoding": sorted(self.work)}
            if self.alternatives is not None:
                told["alternatives"] = dict(self.alternatives)
            self._notify({**told, **self._extras()})

    @property
    def busy(self) -> bool:
        return bool(self.work)

    def track(self, uri: str, job: asyncio.Future, awaited: bool = False) -> None:
        """An engine `job` for document `uri` began: BUSY (told when that changes what the client
        knows) until it is over; `awaited`: a request awaits it, and tells its end (`awaiting(uri, False)`)."""
        job.add_done_callback(lambda _: self._work_ended(uri))
        first = uri not in self.work
        self.work[uri] = self.work.get(uri, 0) + 1
        if awaited:
            self.awaiting(uri, True)
        if first:
            self.activity = BUSY
            self.tell()

    def _work_ended(self, uri: str) -> None:
        """An engine job for `uri` is over (answered, decoded on to its end, cancelled, or failed)."""
        left = self.work.get(uri, 0) - 1
        if left > 0:
            self.work[uri] = left
            return
        self.work.pop(uri, None)
        if not self.waiting.get(uri):  # else the request awaiting it tells, with its answer
            self.activity = BUSY if self.work else self.outcome
            self.tell()

    def awaiting(self, uri: str, started: bool) -> None:
        """A request for `uri` started (or stopped) awaiting its engine job."""
        left = self.waiting.get(uri, 0) + (1 if started else -1)
        if left > 0:
            self.waiting[uri] = left
        else:
            self.waiting.pop(uri, None)

    def final_alternatives(self, count: int, k: int) -> None:
        """The distinct alternatives of a final answer, of the `k` asked for (told when that changed)."""
        alternatives = {"count": count, "k": k}
        if alternatives != self.alternatives:
            self.alternatives = alternatives
            self.tell()

    def engine_status(self, status: Status) -> None:
        self.status = status
        self.tell()

    def set_activity(self, outcome: str) -> None:
        """How the last request ended; the activity is BUSY instead while engine work runs; told
        to the client when it changes."""
        self.outcome = outcome
        activity = BUSY if self.busy else outcome
        if activity != self.activity:
            self.activity = activity
            self.tell()

    def answered(self, model: str, latency_ms: float, timing_ms: dict[str, float] | None = None) -> None:
        """An answer the user waited for: its latency, what its prompt held (the engine's
        `timing_ms`: context tokens, prompt tokens, those the prefix cache had, the prefill's
        time), and the engine is ready."""
        timing = timing_ms or {}
        self.context_tokens = int(timing.get("context_tokens", 0))
        self.prompt = {name: round(timing[key], 1) for name, key in PROMPT_TIMING.items() if key in timing}
        self.outcome = IDLE
        self.activity = BUSY if self.busy else IDLE
        self.status = msgspec.structs.replace(self.status, state=READY, message="ready", model=model, latency_ms=latency_ms)
        self.tell()

    def machine_choice(self, name: str, value: Any, user_set: set[str]) -> Any:
        """A setting's value: the user's when given (`user_set`), else what the engine chose for
        this machine (its status' defaults: k, max_tokens, first_answer_ms, ...)."""
        defaults = self.status.defaults
        chosen = defaults.get(name) if defaults and name not in user_set else None
        if chosen is None:
            return value
        return int(chosen) if isinstance(value, int) else chosen


def status_for_editor(status: Status) -> dict[str, Any]:
    """The engine's status as `$/kspec/status` tells it (camelCase; what is unknown left out)."""
    told: dict[str, Any] = {"state": status.state, "message": status.message, "model": status.model}
    if status.progress is not None:
        told["progress"] = status.progress
    if status.latency_ms is not None:
        told["latencyMs"] = round(status.latency_ms, 1)
    if status.engine_pid is not None:
        told["enginePid"] = status.engine_pid
    if status.defaults is not None:
        told["defaults"] = {camel(key): value for key, value in status.defaults.items()}
    if status.attention is not None:
        told["attention"] = dict(status.attention)
    if status.kernels:
        told["kernels"] = status.kernels
    return told

