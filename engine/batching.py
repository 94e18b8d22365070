"""Continuous batching across requests: the requests of several editors (or documents)
decoded together.

Each request keeps its own shared prefix and k branches (its own BranchKVCache); a
round verifies the union of every request's live branches in ONE target forward pass
(`BranchCacheGroup`: projections and MLPs over all rows, attention per request). A
request that finishes, is cancelled or runs out of time leaves at the end of the round
it happens in; a new one joins at the next round, after one chunk of its prompt's
prefill per round (so a long prompt does not stall the others for more than a chunk).
`max_requests` bounds the batch; 1 serves requests one at a time (the baseline).
Drafting stays per request (each has its own drafter and γ); rows of different draft
lengths are padded to the longest, and padding is never kept.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from engine.api import CancelToken, CompletionRequest, Done
from engine.errors import DeadlineExceeded, KspecError
from engine.kv import BranchCacheGroup
from engine.speculative import pad_rows

if TYPE_CHECKING:
    from engine.completion import ActiveCompletion, CompletionEngine

log = logging.getLogger("kspec.batching")


@dataclass(frozen=True)
class BatchConfig:
    max_requests: int = 16  # requests decoded together; the rest wait in arrival order
    prefill_chunks_per_round: int = 4  # bounds a round's prefill work when many requests arrive at once

    def __post_init__(self) -> None:
        if not 1 <= self.max_requests <= 256:
            raise ValueError(f"max_requests must be between 1 and 256, got {self.max_requests}")
        if self.prefill_chunks_per_round < 1:
            raise ValueError(f"prefill_chunks_per_round must be >= 1, got {self.prefill_chunks_per_round}")


@dataclass
class _Member:
    active: "ActiveCompletion"
    done: Done


class ContinuousBatcher:
    """Runs on one thread: `add` requests, call `run_round` until `idle`."""

    def __init__(self, engine: "CompletionEngine", config: BatchConfig = BatchConfig()):
        self.engine, self.config = engine, config
        self._waiting: deque[tuple[CompletionRequest, CancelToken, Done, float]] = deque()
        self._members: list[_Member] = []
        self.rounds = 0
        self.largest_batch = 0  # most requests verified in one round
        self._prefill_turn = 0  # where the next round's prefill chunks start among the preparing

    @property
    def idle(self) -> bool:
        return not self._members and not self._waiting

    @property
    def size(self) -> int:
        return len(self._members)

    def add(self, request: CompletionRequest, cancel: CancelToken, done: Done) -> None:
        """Queue a request; `done(result, error)` is called once, from `run_round`."""
        self._waiting.append((request, cancel, done, time.monotonic()))

    def cancel_all(self) -> None:
        for member in self._members:
            member.active.cancel.cancel()
        for _, cancel, _, _ in self._waiting:
            cancel.cancel()

    def run_round(self) -> None:
        with self.engine.lock:
            self._admit()
            self._prepare()
            self._decode()

    def _admit(self) -> None:
        while self._waiting and len(self._members) < self.config.max_requests:
            request, cancel, done, arrived = self._waiting.popleft()
            remaining_ms = request.deadline_ms - (time.monotonic() - arrived) * 1000  # waiting counts
            if remaining_ms <= 1:
                done(None, DeadlineExceeded("the deadline passed while waiting for a place in the batch"))
                continue
            try:
                self._members.append(_Member(self.engine.begin(replace(request, deadline_ms=remaining_ms), cancel), done))
            except Exception as exc:  # an invalid request (InputError) fails alone
                done(None, exc)

    def _prepare(self) -> None:
        """One prefill chunk for each request still being prepared, at most
        `prefill_chunks_per_round` in all; the turn rotates, so with more newcomers than
        that each still gets a chunk every few rounds (and a round stays short for the
        requests that are decoding). Cancelled or late ones end here without a chunk."""
        preparing = [m for m in self._members if m.active.preparing]
        over_already = [m for m in preparing if m.active.expired]
        waiting = [m for m in preparing if m not in over_already]
        start = self._prefill_turn % len(waiting) if waiting else 0
        chosen = (waiting[start:] + waiting[:start])[: self.config.prefill_chunks_per_round]
        self._prefill_turn = start + len(chosen)
        for member in over_already + chosen:
            try:
                over = member.active.prepare_step()
            except Exception as exc:
                self._fail(member, exc)
                continue
            if over:
                self._finish(member)

    def _decode(self) -> None:
        """One speculative round over every decoding request's live branches."""
        decoding = [m for m in self._members if m.active.run is not None and not m.active.preparing]
        running, rows = [], []
        for member in decoding:
            run = member.active.run
            assert run is not None
            try:
                if run.finished():
                    self._finish(member)
                    continue
                rows.append(run.propose())
            except Exception as exc:  # a drafter's failure ends its own request only
                self._fail(member, exc)
                continue
            running.append(member)
        if not running:
            return
        runs = [member.active.run for member in running]
        model = self.engine.target.model
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                inputs = pad_rows([row for request_rows in rows for row in request_rows], model.device)  # [B, T]
                group = BranchCacheGroup([run.cache for run in runs])  # type: ignore[union-attr]
                logits = model.logits(model(inputs, group))  # [B, T, V]
        except Exception as exc:  # a failed shared pass fails every request in it
            for member in running:
                self._fail(member, exc)
            return
        verify_ms = (time.perf_counter() - started) * 1000
        self.rounds += 1
        self.largest_batch = max(self.largest_batch, len(running))
        for member, part in zip(running, logits.split([len(r) for r in rows])):
            try:
                member.active.run.accept(part, verify_ms)  # type: ignore[union-attr]
                if member.active.run.finished():  # type: ignore[union-attr]
                    self._finish(member)
            except Exception as exc:
                self._fail(member, exc)

    def _finish(self, member: _Member) -> None:
        self._members.remove(member)
        try:
            result = member.active.result()
        except Exception as exc:
            log.exception("post-processing failed")
            member.done(None, exc)
            return
        member.done(result, None)

    def _fail(self, member: _Member, error: BaseException) -> None:
        if not isinstance(error, KspecError):
            log.exception("a request failed", exc_info=error)
        if member in self._members:
            self._members.remove(member)
        member.done(None, error)
