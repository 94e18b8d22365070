"""The benches' statistics, defined once: percentiles and interleaved timing (A B A B ...).

Speed claims are ratios of runs interleaved in one process, summarised by medians: these
machines are noisy, and interleaving spreads the noise over every contender alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0 < q < 100) of `values`, linear between ranks (the "inclusive"
    method: the median for q = 50, the largest value for q near 100); None when empty."""
    if not 0 < q < 100:
        raise ValueError(f"q must lie in (0, 100), got {q}")
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def time_interleaved(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, list[float]]:
    """Each callable once per repeat, in turn (A B A B ...); a callable returns the units of
    work it did (tokens). -> units per second of each run, per repeat."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            units = run()
            rates[name].append(units / (time.perf_counter() - started))
    return rates
