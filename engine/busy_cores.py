"""Threads that fit the cores that are free: when another process takes one of a laptop's cores,
a round split over every core waits for the thread that shares its core (each parallel region
ends at a barrier), and a keystroke's prefill took 1.7-3.7 s instead of ~50 ms (Zen 4, 2 cores,
one spinning: a fresh 233-token prompt's prefill 1.6 s on 2 threads, 0.89 s on one). Two signals:

- the system's own count (`OtherProcesses`: /proc/stat less this process's CPU time): where other
  processes used most of a core since the engine last looked (`TAKEN_CORE`), before any round, the
  engine runs with the cores that are left, so a prefill that starts on a busy machine starts on
  them; where they use next to nothing (`FREE_CORE`), every core again;
- its own decode rounds, slower than the machine's fitted round: it tries one thread fewer, and
  keeps it only where its rounds are faster; now and then it tries the core again, unless the
  system's count says the core is still taken.

Only decode rounds are compared (their cost is mostly the weights read once), and only with rounds
of their own size: a round that verifies k rows of drafts computes several times the tokens of one
without, and a median of a mix is no measure of the threads. Rounds are classed by the tokens they
feed (`size_class`); a class is slow against the fastest median it had on every core (or, before it
has one, the fitted round: for the classes up to one token a row, which cost no more than the
fitted average), and a trial count is kept only where the same class is faster. A
prefill chunk's rounds run with whatever count the decode rounds chose. A user's `--threads` pins
the count: then nothing here runs.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

ROUNDS_PER_VERDICT = 6  # decode rounds of one size class timed before a thread count is judged (their median)
SLOW_FACTOR = 1.5  # rounds this much slower than that class's pace mean a core is taken
RETRY_S = 15.0  # on fewer threads, try one more again after this long (the other process may be gone)
TRIAL_ROUNDS = 4 * ROUNDS_PER_VERDICT  # a trial that met no round of the class it is compared on by then goes back
LOOK_S = 0.25  # the least time between two looks at what other processes used (10 ms ticks: 4 % of a core)
TAKEN_CORE = 0.6  # of a core, used by other processes since the last look: that core is taken
FREE_CORE = 0.25  # at most this much of every core: the cores are free again


class OtherProcesses:
    """Cores the other processes on this process's CPUs used between two calls of `since_last()`:
    their busy time in /proc/stat (user, nice, system, irq, softirq, steal) less this process's own
    (/proc/self/stat), over the wall time. None on the first call and where the system does not
    say (not Linux). `read` returns a /proc file's text (tests give their own)."""

    def __init__(self, read: Callable[[str], str] = lambda path: Path(path).read_text(), clock: Callable[[], float] = time.monotonic):
        self._read, self._clock = read, clock
        self._cpus = {f"cpu{cpu}" for cpu in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, int, int] | None = None  # (when, ticks busy on our CPUs, our ticks)

    def since_last(self) -> float | None:
        try:
            now, busy, own = self._clock(), self._busy_ticks(), self._own_ticks()
        except (OSError, ValueError, IndexError):
            return None
        last, self._last = self._last, (now, busy, own)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (busy - last[1] - (own - last[2])) / self._ticks / (now - last[0]))

    def _busy_ticks(self) -> int:
        total = 0
        for line in self._read("/proc/stat").splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu" and (self._cpus is None or name in self._cpus):
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(field) for field in fields[:8])
                total += user + nice + system + irq + softirq + steal
        return total

    def _own_ticks(self) -> int:
        fields = self._read("/proc/self/stat").rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5), counted after the name


def size_class(tokens: int) -> int:
    """The class of a round that feeds `tokens` tokens: 1, 2, 3-4, 5-8, ... (0, 1, 2, 3, ...)."""
    return max(0, tokens - 1).bit_length()


@dataclass
class RoundShape:
    """What a timed round fed: set by the caller inside `CoreGovernor.round`."""

    tokens: int = 0


@dataclass
class _Trial:
    threads: int  # being tried
    size: int  # the size class it is compared on
    against: float  # that class's median round (ms) at the count it may replace
    previous: int
    rounds: int = 0  # decode rounds it has run


class CoreGovernor:
    """Chooses the thread count from the engine's own decode rounds (see the module's text).
    `round()` wraps each round on the thread that runs them (PyTorch's thread count is that
    thread's setting) and yields a `RoundShape` for the caller to fill in. fitted_round: the
    machine's fitted round (ms) and its rows (one token each), None before the fit."""

    def __init__(
        self,
        threads: int,
        fitted_round: Callable[[], tuple[float, int] | None],
        set_threads: Callable[[int], None],
        clock: Callable[[], float] = time.perf_counter,
        others: Callable[[], float | None] = lambda: None,
    ):
        """`others`: the cores other processes used since its last call (`OtherProcesses.since_last`), or None."""
        self.full = self.threads = threads
        self._fitted, self._set, self._clock, self._others = fitted_round, set_threads, clock, others
        self._others()  # the first look's starting point
        self._looked = clock()  # when `others` was last asked
        self._times: dict[int, list[float]] = {}  # size class -> ms of its decode rounds at the current count
        self._pace: dict[int, float] = {}  # size class -> its fastest median on every core
        self._trial: _Trial | None = None
        self._since = clock()  # when the current count was settled
        self._calm_until = 0.0  # no trial before this (a trial just failed)
        self._others_hold = False  # the last look said other processes hold at least one core
        self.changes: list[tuple[int, str]] = []  # (threads, why), newest last: for the status and tests

    @contextmanager
    def round(self, decode_only: bool) -> Iterator[RoundShape]:
        self._look()
        started, shape = self._clock(), RoundShape()
        yield shape
        if not decode_only or shape.tokens <= 0:
            return
        size = size_class(shape.tokens)
        times = self._times.setdefault(size, [])
        times.append((self._clock() - started) * 1000)
        if self._trial is not None:
            self._trial.rounds += 1
        if len(times) >= ROUNDS_PER_VERDICT:
            self._times[size] = []
            self._judge(size, statistics.median(times))
        if self._trial is not None and self._trial.rounds >= TRIAL_ROUNDS:
            self._end_trial(self._trial, False, f"{self._trial.threads} threads: no rounds like those it is compared on")

    def _look(self) -> None:
        """Before a round: the cores other processes took since the last look, where the system says."""
        now = self._clock()
        if now - self._looked < LOOK_S:
            return
        self._looked, used = now, self._others()
        if used is None:
            return
        free = max(1, min(self.full, self.full - int(used + 1 - TAKEN_CORE)))  # a core taken from TAKEN_CORE of one
        self._others_hold = free < self.full
        if free < self.threads or (self.threads < self.full and used <= FREE_CORE * self.full):
            threads = free if free < self.threads else self.full
            self._trial, self._times = None, {}
            self._settle(threads, f"other processes used {used:.2f} cores: {threads} threads")

    def _judge(self, size: int, median_ms: float) -> None:
        trial, now = self._trial, self._clock()
        if trial is not None:
            if size == trial.size:
                why = f"{trial.threads} threads {median_ms:.1f} ms a round vs {trial.against:.1f}"
                self._end_trial(trial, median_ms < trial.against, why)
            return
        fitted = self._fitted()
        pace = self._pace.get(size, fitted[0] if fitted is not None and size <= size_class(fitted[1]) else None)
        if self.threads == self.full:
            self._pace[size] = min(median_ms, self._pace.get(size, median_ms))
        if now < self._calm_until:
            return
        if self.threads > 1 and pace is not None and median_ms > SLOW_FACTOR * pace:
            self._try(self.threads - 1, size, median_ms)
        elif self.threads < self.full and now - self._since >= RETRY_S and not self._others_hold:
            self._try(self.threads + 1, size, median_ms)

    def _try(self, threads: int, size: int, against: float) -> None:
        self._trial = _Trial(threads, size, against, self.threads)
        self._times = {}
        self.threads = threads
        self._set(threads)

    def _end_trial(self, trial: _Trial, kept: bool, why: str) -> None:
        self._trial, self._times = None, {}
        if not kept:
            self._calm_until = self._clock() + RETRY_S
        self._settle(trial.threads if kept else trial.previous, why + (": kept" if kept else ": back"))

    def _settle(self, threads: int, why: str) -> None:
        if threads != self.threads:
            self._set(threads)
        self.threads, self._since = threads, self._clock()
        self.changes.append((threads, why))
