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
lengths are padded to the longest, and padding is never kept (nor computed, where the C++
layer loop runs the pass: `row_lengths`).

A round is three steps, as serving engines read: `_schedule` (who joins, who leaves, who
gets a prefill chunk), `_run` (the prefill chunks, the drafts, then ONE forward pass over
the union of live rows), `_update` (each request accepts its part; finished ones leave).
Each request's state is explicit: `request.RequestState`.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kspec.engine.api import CancelToken, CompletionRequest, Done, EarlyAnswer, admitted
from kspec.engine.busy_cores import CoreGovernor, RoundShape
from kspec.engine.cache.kv import BranchCacheGroup
from kspec.engine.decode.speculative import SpeculativeRun, pad_rows
from kspec.engine.errors import KspecError
from kspec.engine.request import ActiveCompletion, EngineParts, RequestState
from kspec.engine.waiting_line import Waiting, WaitingLine

log = logging.getLogger("kspec.batching")


class BatchEngine(EngineParts, Protocol):
    """What the batcher needs of the engine (CompletionEngine): what its requests use, and its lock."""

    lock: threading.Lock


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
    active: ActiveCompletion
    done: Done
    early: EarlyAnswer | None = None  # called with each new non-empty interim answer, from first_answer_ms on
    shown: tuple[str, ...] = ()  # the texts of the last interim answer given to `early`


@dataclass
class _Round:
    """One round: who `_schedule` gave a prefill chunk, who `_run` verified."""

    prefill: list[_Member] = field(default_factory=list)  # one prompt chunk each (or their end, if expired)
    decode: list[_Member] = field(default_factory=list)  # in this round's verification pass
    rows: list[list[list[int]]] = field(default_factory=list)  # each decode member's token rows
    verify_ms: float = 0.0  # the shared verification pass, once run
    tokens: int = 0  # the tokens it fed (padding aside)


class ContinuousBatcher:
    """Runs on one thread: `add` requests, call `run_round` until `idle`."""

    def __init__(self, engine: BatchEngine, config: BatchConfig = BatchConfig(), cores: CoreGovernor | None = None, waiting: WaitingLine | None = None):
        """`cores`: the thread count follows the cores that are free (engine/busy_cores.py);
        `waiting`: the line requests wait in until they join the batch (its owner's, shared with
        the threads that put requests in; a new one by default)."""
        self.engine, self.config, self.cores = engine, config, cores
        self._waiting = WaitingLine() if waiting is None else waiting
        self._members: list[_Member] = []
        self.rounds = 0
        self.largest_batch = 0  # most requests verified in one round
        self._prefill_turn = 0  # where the next round's prefill chunks start among the preparing

    @property
    def idle(self) -> bool:
        return not self._members and not len(self._waiting)

    @property
    def size(self) -> int:
        return len(self._members)

    def add(self, request: CompletionRequest, cancel: CancelToken, done: Done, early: EarlyAnswer | None = None, arrived: float | None = None) -> None:
        """Queue a request; `done(result, error)` is called once, from `run_round`. With
        `request.first_answer_ms` > 0, `early(result)` is called before that: at the end of
        the prompt's prefill (each branch holds its first token) or of the first round past that
        moment, whichever comes first with an interim answer that has an alternative, and again after each
        later round whose interim answer says something else (the branches grew), so that a
        typist's next keystrokes can be served from what the branches have written by then.
        `arrived` (time.monotonic(), default now) is when the request reached the engine: its
        deadline and early answer count from then, here and nowhere else."""
        self._waiting.put(Waiting(request, cancel, done, early, time.monotonic() if arrived is None else arrived))

    def cancel_all(self) -> None:
        for member in self._members:
            member.active.cancel.cancel()
        self._waiting.cancel_all()

    def run_round(self) -> None:
        with self.engine.lock:
            plan = self._schedule()
            with self.cores.round(decode_only=not plan.prefill) if self.cores is not None else nullcontext(RoundShape()) as shape:
                hidden = self._run(plan)
                shape.tokens = plan.tokens
            self._update(plan, hidden)

    # -- schedule: who joins, who prefills a chunk, who decodes, who leaves ------------

    def _schedule(self) -> _Round:
        self._admit()
        self._leave([m for m in self._members if m.active.state is RequestState.OVER])
        return _Round(prefill=self._prefill_turns())

    def _admit(self) -> None:
        while len(self._members) < self.config.max_requests and (waiting := self._waiting.take()) is not None:
            request, cancel, done, early, arrived = waiting
            try:
                self._members.append(_Member(ActiveCompletion(self.engine, admitted(request, arrived), cancel), done, early))
            except Exception as exc:  # an invalid request (InputError) fails alone
                done(None, exc)

    def _prefill_turns(self) -> list[_Member]:
        """Requests being prepared that get a prefill chunk this round: every expired one
        (its chunk is its end) and at most `prefill_chunks_per_round` others; the turn
        rotates, so with more newcomers than that each still gets a chunk every few rounds
        (and a round stays short for the requests that are decoding)."""
        preparing = [m for m in self._members if m.active.state is RequestState.PREPARING]
        over_already = [m for m in preparing if m.active.expired]
        waiting = [m for m in preparing if m not in over_already]
        start = self._prefill_turn % len(waiting) if waiting else 0
        chosen = (waiting[start:] + waiting[:start])[: self.config.prefill_chunks_per_round]
        self._prefill_turn = start + len(chosen)
        return over_already + chosen

    # -- run: the prefill chunks, then one forward pass over the union of live rows -----

    def _run(self, plan: _Round) -> torch.Tensor | None:
        for member in plan.prefill:
            try:
                member.active.prepare_step()
                if member.early is not None and member.active.early_answer_due:
                    self._answer_early(member)  # each branch's first token came with the prompt's logits
            except Exception as exc:
                self._fail(member, exc)
        self._draft(plan)  # a request whose prompt became ready just now decodes in this round too
        if not plan.decode:
            return None
        model = self.engine.target.model
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                rows = [row for request_rows in plan.rows for row in request_rows]
                plan.tokens = sum(len(row) for row in rows)
                inputs = pad_rows(rows, model.device)  # [B, T]
                caches = [self._run_of(m).cache for m in plan.decode]
                # one request: its own cache, which the CPU fast path's C++ layer loop serves
                cache = caches[0] if len(caches) == 1 else BranchCacheGroup(caches)
                # the C++ layer loop skips the padding of drafts shorter than the longest
                hidden = model(inputs, cache, row_lengths=[len(row) for row in rows])  # [B, T, dim]: each request's run takes the logits it needs
        except Exception as exc:  # a failed shared pass fails every request in it
            for member in plan.decode:
                self._fail(member, exc)
            plan.decode.clear()
            return None
        plan.verify_ms = (time.perf_counter() - started) * 1000
        self.rounds += 1
        self.largest_batch = max(self.largest_batch, len(plan.decode))
        return hidden

    def _draft(self, plan: _Round) -> None:
        """Every decoding request proposes its rows (its drafter's tokens per branch)."""
        for member in [m for m in self._members if m.active.state is RequestState.DECODING]:
            run = self._run_of(member)
            try:
                if run.finished():  # cancelled or late since the last round
                    member.active.after_round()
                    continue
                plan.rows.append(run.propose())
            except Exception as exc:  # a drafter's failure ends its own request only
                self._fail(member, exc)
                continue
            plan.decode.append(member)

    # -- update: each request accepts its part; finished requests leave -----------------

    def _update(self, plan: _Round, hidden: torch.Tensor | None) -> None:
        if hidden is not None:
            for member, part in zip(plan.decode, hidden.split([len(r) for r in plan.rows])):
                try:
                    self._run_of(member).accept(part, plan.verify_ms, plan.tokens)
                    member.active.after_round(batch_requests=len(plan.decode))
                    if member.early is not None and member.active.early_answer_due:
                        self._answer_early(member)
                except Exception as exc:
                    self._fail(member, exc)
        self._leave([m for m in self._members if m.active.state is RequestState.OVER])

    @staticmethod
    def _answer_early(member: _Member) -> None:
        interim = member.active.result(interim=True)
        texts = tuple(c.text for c in interim.completions)
        if texts and texts != member.shown and member.early is not None:
            member.shown = texts
            member.early(interim)

    def _leave(self, over: list[_Member]) -> None:
        for member in over:
            self._finish(member)

    @staticmethod
    def _run_of(member: _Member) -> SpeculativeRun:
        run = member.active.run
        if run is None:
            raise RuntimeError("a decoding request has no decoding state")
        return run

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

