"""Threads that fit the cores that are free: when another process takes one of a laptop's cores,
a round split over every core waits for the thread that shares its core (each parallel region
ends at a barrier), and a keystroke's prefill took 1.7-3.7 s instead of ~50 ms. The engine
notices it by its own decode rounds, slower than the machine's fitted round, tries one thread
fewer, and keeps it only where its rounds are faster; now and then it tries the core again.

Only decode rounds are compared (their cost is the weights read once, nearly the same from round
to round); a prefill chunk's rounds run with whatever count the decode rounds chose. A user's
`--threads` pins the count: then nothing here runs.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

ROUNDS_PER_VERDICT = 6  # decode rounds timed before a thread count is judged (their median)
SLOW_FACTOR = 1.5  # rounds this much slower than the fitted round mean a core is taken
RETRY_S = 15.0  # on fewer threads, try one more again after this long (the other process may be gone)


@dataclass
class _Trial:
    threads: int  # being tried
    against: float  # the median round (ms) of the count it may replace
    previous: int


class CoreGovernor:
    """Chooses the thread count from the engine's own decode rounds (see the module's text).
    `round()` wraps each round on the thread that runs them (PyTorch's thread count is that
    thread's setting)."""

    def __init__(
        self,
        threads: int,
        fitted_round_ms: Callable[[], float | None],
        set_threads: Callable[[int], None],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.full = self.threads = threads
        self._fitted, self._set, self._clock = fitted_round_ms, set_threads, clock
        self._times: list[float] = []  # ms of the decode rounds at the current count
        self._trial: _Trial | None = None
        self._since = clock()  # when the current count was settled
        self._calm_until = 0.0  # no trial before this (a trial just failed)
        self.changes: list[tuple[int, str]] = []  # (threads, why), newest last: for the status and tests

    @contextmanager
    def round(self, decode_only: bool) -> Iterator[None]:
        started = self._clock()
        yield
        if decode_only:
            self._times.append((self._clock() - started) * 1000)
            if len(self._times) >= ROUNDS_PER_VERDICT:
                self._judge(statistics.median(self._times))

    def _judge(self, median_ms: float) -> None:
        self._times = []
        trial, now = self._trial, self._clock()
        if trial is not None:
            self._trial = None
            kept = median_ms < trial.against
            if not kept:
                self._calm_until = now + RETRY_S
            self._settle(trial.threads if kept else trial.previous,
                         f"{trial.threads} threads {median_ms:.1f} ms a round vs {trial.against:.1f}: " + ("kept" if kept else "back"))  # fmt: skip
            return
        fitted = self._fitted()
        if now < self._calm_until:
            return
        if self.threads > 1 and fitted is not None and median_ms > SLOW_FACTOR * fitted:
            self._try(self.threads - 1, median_ms)
        elif self.threads < self.full and now - self._since >= RETRY_S:
            self._try(self.threads + 1, median_ms)

    def _try(self, threads: int, against: float) -> None:
        self._trial = _Trial(threads, against, self.threads)
        self.threads = threads
        self._set(threads)

    def _settle(self, threads: int, why: str) -> None:
        if threads != self.threads:
            self._set(threads)
        self.threads, self._since = threads, self._clock()
        self.changes.append((threads, why))
