"""What one call of the model's head costs.

The head turns final hidden states into logits over the vocabulary. On kspec's CPU kernel a
call reads every weight of it (the default 0.5B's tied 151936 x 896 table: 136 MB in 8 bits)
and then does each row's own arithmetic, so a call costs about `call_ms + row_ms x rows`; a
row's logits are the same in any call. Greedy acceptance weighs one call against rows with it
(engine/decode/acceptance.py: `HeadPlan`).

`HeadCost` is measured at the machine fit (`measure_head`, cached with the fit's timing), with the
CPU profile's figures (`HEAD_COST_PRIOR`) as the prior until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from kspec.engine.machine_fit import median_call_ms

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
            times[count] = round(median_call_ms(lambda: logits(states), TIMED_REPEATS), 4)
    return times
