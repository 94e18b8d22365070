"""What one call of the model's head costs, and how far a verification's first call reaches.

The head turns final hidden states into logits over the vocabulary. On kspec's CPU kernel a
call reads every weight of it (the default 0.5B's tied 151936 x 896 table: 136 MB in 8 bits)
and then does each row's own arithmetic, so a call costs about `call_ms + row_ms x rows`; a
row's logits are the same in any call. Greedy acceptance needs a draft position's logits only
where a row's drafts all matched so far (engine/decode/acceptance.py: `accept_greedy_by_position`):
computing position j's rows in the round's first call costs their rows for sure; leaving them
out costs another call in the rounds that reach j. `HeadPlan` takes position j into the first
call while `reach(j) x call_ms >= row_ms x rows(j)`, with `reach(j)` the share of the run's
earlier rounds that reached j (smoothed; `REACH_PRIOR` before any).

`HeadCost` is measured at the machine fit (`measure_head`, cached with the fit's timing), with the
CPU profile's figures (`HEAD_COST_PRIOR`) as the prior until then.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

REACH_PRIOR = 0.5  # a position's reach before the run measured it
REACH_SMOOTHING = 0.3  # weight of the newest round in a position's reach
TIMED_ROWS = (1, 16)  # the row counts `measure_head` times
TIMED_REPEATS = 5  # calls per row count; the median is kept


@dataclass(frozen=True)
class HeadCost:
    call_ms: float  # a call's time beyond its rows: reading the head's weights
    row_ms: float  # each row's own arithmetic
    max_rows: int | None = None  # the most rows of a call whose rows' logits do not depend on it (None: any)

    def __post_init__(self) -> None:
        if not (self.call_ms >= 0 and self.row_ms > 0):
            raise ValueError(f"a head's cost needs call_ms >= 0 and row_ms > 0, got {self.call_ms}, {self.row_ms}")

    @classmethod
    def fitted(cls, times_ms: Mapping[int, float], max_rows: int | None = None) -> "HeadCost":
        """The line through the fewest and the most rows timed (rows -> ms of one call)."""
        low, high = min(times_ms), max(times_ms)
        if low == high:
            raise ValueError(f"a head's cost needs two row counts, got {sorted(times_ms)}")
        row_ms = max((times_ms[high] - times_ms[low]) / (high - low), 1e-3)
        return cls(max(0.0, times_ms[low] - row_ms * low), row_ms, max_rows)

    def describe(self) -> str:
        return f"head {self.call_ms:.2f} ms a call + {self.row_ms:.3f} ms a row"


def measure_head(
    logits: Callable[[Tensor], Tensor], dim: int, dtype: torch.dtype = torch.float32, rows: Sequence[int] = TIMED_ROWS
) -> dict[int, float]:
    """Median ms of one call of `logits` ([n, dim] -> [n, V]) at each of `rows`, on seeded states of `dtype`."""
    times: dict[int, float] = {}
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for count in rows:
            states = torch.randn(count, dim, generator=generator).to(dtype)  # [n, dim]
            logits(states)  # the first call of a shape allocates
            samples = []
            for _ in range(TIMED_REPEATS):
                started = time.perf_counter()
                logits(states)
                samples.append((time.perf_counter() - started) * 1000)
            times[count] = round(statistics.median(samples), 4)
    return times


class HeadPlan:
    """One run's choice of how far each round's first call of the head reaches, and the share of
    rounds that reached each draft position (index 0: position 1)."""

    def __init__(self, cost: HeadCost | None):
        self.cost = cost  # None: position by position (a head whose row may round by its call)
        self._reach: list[float] = []

    def reach(self, position: int) -> float:
        """The share of rounds that needed `position`'s logits (position >= 1), never above an
        earlier position's."""
        shares = [*self._reach[:position], *[REACH_PRIOR] * max(0, position - len(self._reach))]
        return min(shares)

    def positions(self, lengths: Sequence[int]) -> int:
        """How many positions after the first the round's first call computes, for drafts of
        these lengths (a position's rows: the drafts that long)."""
        if self.cost is None:
            return 0
        ahead, held = 0, len(lengths)  # position 0: every row
        for position in range(1, max(lengths, default=0) + 1):
            rows = sum(1 for length in lengths if length >= position)
            over = self.cost.max_rows is not None and held + rows > self.cost.max_rows
            if over or self.reach(position) * self.cost.call_ms < self.cost.row_ms * rows:
                break
            ahead, held = position, held + rows
        return ahead

    def record(self, lengths: Sequence[int], accepted: Sequence[int]) -> None:
        """A round's drafts' lengths and the drafts each row accepted: position j was reached
        where some row accepted j drafts."""
        deepest = max(accepted, default=0)
        for position in range(1, max(lengths, default=0) + 1):
            while len(self._reach) < position:
                self._reach.append(REACH_PRIOR)
            seen = 1.0 if deepest >= position else 0.0
            self._reach[position - 1] += REACH_SMOOTHING * (seen - self._reach[position - 1])
