"""Defaults that fit the machine: at start the engine times its own decode round and
prefill, then picks k, max tokens and the first-answer moment so that a typist sees a
suggestion while still typing. A user's explicit settings always win over these.

The rule (each threshold in one place, below): a suggestion should be on screen about
`TARGET_FIRST_ANSWER_MS` after a keystroke. Within that budget a request takes the keystroke
into its cached prompt (measured: `keystroke_ms`) and decodes rounds; a speculative round
yields ~`TOKENS_PER_ROUND` tokens per branch. The first answer is due when the first words
can be there (`FIRST_WORD_TOKENS`: an interim answer shows what the branches wrote so far
when no line is complete yet, and the final answer replaces it); k shrinks until those
words fit the budget (never below `MIN_K`), and max tokens is what fits in
`DECODE_BUDGET_MS` (a block, not a novel): decoding goes on after the first answer.
A prompt the prefix cache does not hold (a new document, a new place in a long one) costs
a prefill of all its tokens: the prompt budget is what prefills in about `COLD_PROMPT_MS`
(within `PROMPT_TOKENS_RANGE`), so a typist at a new place waits seconds, not ten.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

TARGET_FIRST_ANSWER_MS = 250.0  # what Continue and llama.vim aim for (300 ms / 250 ms caps)
FIRST_ANSWER_RANGE_MS = (120.0, 1500.0)  # never sooner (no line can be ready), never later (useless)
LINE_TOKENS = 12
FIRST_WORD_TOKENS = 3  # enough for a word or two of ghost text
TOKENS_PER_ROUND = 1.5  # measured mean accepted tokens per branch-round with prompt lookup on code
DECODE_BUDGET_MS = 2500.0  # decoding goes on after the first answer, into the typeahead cache
K_CHOICES = (4, 3, 2)
MIN_K = 2
MAX_TOKENS_RANGE = (16, 64)
COLD_PROMPT_MS = 1500.0
PROMPT_TOKENS_RANGE = (384, 1536)  # below, too little of the file; above, the engine's default budget


@dataclass(frozen=True)
class MachineTiming:
    """What the engine measured on itself (ms)."""

    round_ms: dict[int, float]  # one decode round (drafts verified), by k
    prefill_ms_per_token: float  # a cold prompt's prefill, per token
    keystroke_ms: float  # a prompt one keystroke longer than a cached one, to its first logits

    def __post_init__(self) -> None:
        if not self.round_ms or any(v <= 0 or not math.isfinite(v) for v in self.round_ms.values()):
            raise ValueError(f"round times must be positive, got {self.round_ms}")
        if self.prefill_ms_per_token < 0 or self.keystroke_ms < 0:
            raise ValueError(f"prefill times must be >= 0, got {self.prefill_ms_per_token}, {self.keystroke_ms}")


@dataclass(frozen=True)
class MachineDefaults:
    k: int
    max_tokens: int
    first_answer_ms: float
    round_ms: float  # at that k
    prefill_ms_per_token: float
    keystroke_ms: float
    prompt_tokens: int

    def to_dict(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self).items()}


def _round_ms(timing: MachineTiming, k: int) -> float:
    """The round time at k, from the nearest measured k (a round's cost grows with its rows)."""
    if k in timing.round_ms:
        return timing.round_ms[k]
    nearest = min(timing.round_ms, key=lambda measured: abs(measured - k))
    return timing.round_ms[nearest] * max(1.0, k / nearest) ** 0.5


def tokens_ms(timing: MachineTiming, k: int, tokens: int) -> float:
    """Time from a keystroke to `tokens` new tokens per branch at k branches."""
    return timing.keystroke_ms + math.ceil(tokens / TOKENS_PER_ROUND) * _round_ms(timing, k)


def choose_defaults(timing: MachineTiming) -> MachineDefaults:
    k = next((k for k in K_CHOICES if tokens_ms(timing, k, FIRST_WORD_TOKENS) <= TARGET_FIRST_ANSWER_MS), MIN_K)
    low, high = FIRST_ANSWER_RANGE_MS
    first = min(high, max(low, tokens_ms(timing, k, FIRST_WORD_TOKENS)))
    round_ms = _round_ms(timing, k)
    tokens = int(DECODE_BUDGET_MS / round_ms * TOKENS_PER_ROUND)
    max_tokens = min(MAX_TOKENS_RANGE[1], max(MAX_TOKENS_RANGE[0], tokens))
    fits = COLD_PROMPT_MS / timing.prefill_ms_per_token if timing.prefill_ms_per_token > 0 else PROMPT_TOKENS_RANGE[1]
    prompt_tokens = int(min(PROMPT_TOKENS_RANGE[1], max(PROMPT_TOKENS_RANGE[0], fits)))
    return MachineDefaults(
        k, max_tokens, round(first), round(round_ms, 2), round(timing.prefill_ms_per_token, 3), round(timing.keystroke_ms, 2),
        prompt_tokens,
    )  # fmt: skip
