"""Defaults that fit the machine: at start the engine times its own decode round and
prefill, then picks k, max tokens and the first-answer moment so that a typist sees a
suggestion while still typing. A user's explicit settings always win over these.

The rule (each threshold in one place, below): a suggestion should be on screen about
`TARGET_FIRST_ANSWER_MS` after a keystroke. Within that budget a request prefills the few
tokens the keystroke added and decodes rounds; a line of code is ~`LINE_TOKENS` tokens and a
speculative round yields ~`TOKENS_PER_ROUND` of them per branch. k shrinks until one line
fits the budget (never below `MIN_K`); the first answer is due when a line can be complete,
and max tokens is what fits in `DECODE_BUDGET_MS` after it (a block, not a novel).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

TARGET_FIRST_ANSWER_MS = 250.0  # what Continue and llama.vim aim for (300 ms / 250 ms caps)
FIRST_ANSWER_RANGE_MS = (120.0, 1500.0)  # never sooner (no line can be ready), never later (useless)
LINE_TOKENS = 12
TOKENS_PER_ROUND = 1.5  # measured mean accepted tokens per branch-round with prompt lookup on code
KEYSTROKE_PREFILL_TOKENS = 8  # tokens a keystroke adds to a cached prompt (re-segmented word included)
DECODE_BUDGET_MS = 2500.0  # decoding goes on after the first answer, into the typeahead cache
K_CHOICES = (4, 3, 2)
MIN_K = 2
MAX_TOKENS_RANGE = (16, 64)


@dataclass(frozen=True)
class MachineTiming:
    """What the engine measured on itself (ms)."""

    round_ms: dict[int, float]  # one decode round (drafts verified), by k
    prefill_ms_per_token: float

    def __post_init__(self) -> None:
        if not self.round_ms or any(v <= 0 or not math.isfinite(v) for v in self.round_ms.values()):
            raise ValueError(f"round times must be positive, got {self.round_ms}")
        if self.prefill_ms_per_token < 0:
            raise ValueError(f"prefill_ms_per_token must be >= 0, got {self.prefill_ms_per_token}")


@dataclass(frozen=True)
class MachineDefaults:
    k: int
    max_tokens: int
    first_answer_ms: float
    round_ms: float  # at that k
    prefill_ms_per_token: float

    def to_dict(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self).items()}


def _round_ms(timing: MachineTiming, k: int) -> float:
    """The round time at k, from the nearest measured k (a round's cost grows with its rows)."""
    if k in timing.round_ms:
        return timing.round_ms[k]
    nearest = min(timing.round_ms, key=lambda measured: abs(measured - k))
    return timing.round_ms[nearest] * max(1.0, k / nearest) ** 0.5


def line_ms(timing: MachineTiming, k: int) -> float:
    """Time from a keystroke to one complete line at k branches."""
    rounds = math.ceil(LINE_TOKENS / TOKENS_PER_ROUND)
    return KEYSTROKE_PREFILL_TOKENS * timing.prefill_ms_per_token + rounds * _round_ms(timing, k)


def choose_defaults(timing: MachineTiming) -> MachineDefaults:
    k = next((k for k in K_CHOICES if line_ms(timing, k) <= TARGET_FIRST_ANSWER_MS), MIN_K)
    low, high = FIRST_ANSWER_RANGE_MS
    first = min(high, max(low, line_ms(timing, k)))
    round_ms = _round_ms(timing, k)
    tokens = int(DECODE_BUDGET_MS / round_ms * TOKENS_PER_ROUND)
    max_tokens = min(MAX_TOKENS_RANGE[1], max(MAX_TOKENS_RANGE[0], tokens))
    return MachineDefaults(k, max_tokens, round(first), round(round_ms, 2), round(timing.prefill_ms_per_token, 3))
