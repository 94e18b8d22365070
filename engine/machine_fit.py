"""Defaults that fit the machine: at start the engine times its own decode round and
prefill, then picks k, max tokens and the first-answer moment so that a typist sees a
suggestion while still typing. A user's explicit settings always win over these.

The rule (each threshold in one place, below): a suggestion should be on screen about
`TARGET_FIRST_ANSWER_MS` after a keystroke. Within that budget a request takes the keystroke
into its cached prompt (measured: `keystroke_ms`) and decodes rounds; a speculative round
yields ~`TOKENS_PER_ROUND` tokens per branch. The first answer is due when each branch's
first token is there: it comes with the prompt's logits, at the end of the keystroke's
prefill (an interim answer shows what the branches wrote so far when no line is complete
yet, later rounds grow it and the final answer replaces it; typing at 10 characters a second
leaves ~100 ms per keystroke, and an answer later than that is never seen: at 1.5B a round
later answered 25-39 % of a typing replay's keystrokes, at the prefill's end 51-55 %), half a
round early (the engine answers at the end of the prefill or of the first round past the
moment); k shrinks until the first words (`FIRST_WORD_TOKENS`, one round's worth) fit the
budget (never below `MIN_K`), and max tokens is what fits in
`DECODE_BUDGET_MS` (a block, not a novel): decoding goes on after the first answer.
A prompt the prefix cache does not hold (a new document, a new place in a long one) costs
a prefill of all its tokens: the prompt budget is what prefills in about `COLD_PROMPT_MS`
(within `PROMPT_TOKENS_RANGE`), so a typist at a new place sees a suggestion after about
half a second of typing: every keystroke until then is a request the next one cancels (its
prefill chunks stay in the prefix cache). Measured by `kspec bench keystroke` on a 2-core
CPU: 1500 ms (~1200 tokens there) answered 35 % of the typed keystrokes, 500 ms 50 %.

The timing is kept (`FitCache`) by what it depends on — the model's files, the engine's
settings, this machine, torch and its threads, kspec's version — for `FIT_CACHE_MAX_AGE_S` (one
taken while other work competed for `BUSY_MAX_AGE_S`):
an engine started again (a daemon after a crash, a new editor) does not time itself again.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, TypeVar

from kspec.engine.api import SUFFIX_SHARE
from kspec.engine.config import PROMPT_TOKENS_RANGE
from kspec.engine.json_file import StampedEntries

TARGET_FIRST_ANSWER_MS = 250.0  # what Continue and llama.vim aim for (300 ms / 250 ms caps)
FIRST_ANSWER_RANGE_MS = (30.0, 1500.0)  # never sooner (not a word written yet), never later (useless)
LINE_TOKENS = 12
FIRST_WORD_TOKENS = 1  # what k must fit in one round: a word or a word piece of ghost text, grown by later rounds
TOKENS_PER_ROUND = 1.5  # measured mean accepted tokens per branch-round with prompt lookup on code
DECODE_BUDGET_MS = 2500.0  # decoding goes on after the first answer, into the typeahead cache
K_CHOICES = (4, 3, 2)
MIN_K = 2
MAX_TOKENS_RANGE = (16, 64)
COLD_PROMPT_MS = 500.0
# The text after the cursor follows the text before it in the prompt (FIM's prefix-suffix-middle
# order), so every keystroke the typeahead cache cannot answer prefills it again: at most what
# prefills in this time, never fewer than SUFFIX_TOKENS_MIN (three or four lines), within the
# prompt's SUFFIX_SHARE; a pinned prompt budget keeps the whole share. Zen 4, default 0.5B, fitted
# 384-token prompt (docs/measurements/zen4-suffix-reread.md): typing replay p95 322-382 ms with 96
# suffix tokens, 245-249 ms with 48, 197-225 ms with 32; `kspec bench quality` (56 holes) with 48:
# top-1 exact one hole more, any of 4 one fewer; with 32 any of 4 four fewer on whole files.
SUFFIX_REREAD_MS = 150.0
SUFFIX_TOKENS_MIN = 48
FIT_CACHE_MAX_AGE_S = 7 * 24 * 3600.0  # then measured again
BUSY_MAX_AGE_S = 3600.0  # a timing taken while other work competed (not `quiet`) is reused this long, then measured again
FIT_CACHE_ENTRIES = 32  # the most recent ones are kept
TIMING_METHOD = 3  # part of the cache key: raised when what `measure_machine` times changes (2: a keystroke types a word; 3: the head's calls)
FIT_CACHE_FILE = "machine-fit.json"  # in the cache folder (engine/models/resolve.py cache_root)
QUIET_CPU_SHARE = 0.75  # of the CPU time its threads could have had, a measurement that got less competed with
# other work and is kept for BUSY_MAX_AGE_S only: a busy machine measures at a later start, not at every one
# (2-core Zen 5: 0.77-1.0 quiet, 0.57-0.70 beside one busy process; round 5 vs 10-43 ms)


class Timed(Protocol):
    """A measurement that knows whether other work competed for the cores while it was taken."""

    @property
    def quiet(self) -> bool: ...


def kept_s(measurement: Timed, max_age_s: float) -> float:
    """How long a cached measurement is reused: `max_age_s`, or `BUSY_MAX_AGE_S` at most where other
    work competed while it was taken."""
    return max_age_s if measurement.quiet else min(max_age_s, BUSY_MAX_AGE_S)


TimedT = TypeVar("TimedT", bound=Timed)


class TimedEntries(StampedEntries[TimedT]):
    """Measurements kept by key, each reused for `kept_s` of it (a busy machine's for less)."""

    def __init__(self, path: Path, max_age_s: float, entries: int, kind: type[TimedT]):
        super().__init__(path, max_age_s, entries, kind, lambda measurement: kept_s(measurement, max_age_s))


def usable_cores() -> int | None:
    """The cores this process may run on (its affinity), where the system says."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def cpu_share(cpu_seconds: float, wall_seconds: float, threads: int) -> float:
    """The share of the cores a measurement had: the process's CPU time over wall time x the
    threads it ran (`threads`, at most the cores it may use)."""
    threads = min(threads, usable_cores() or threads)
    return round(cpu_seconds / max(1e-9, wall_seconds * max(1, threads)), 3)


def median_call_ms(call: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `repeats` calls of `call`, after one untimed call (a first call of a
    shape allocates)."""
    call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


@dataclass(frozen=True)
class MachineTiming:
    """What the engine measured on itself (ms)."""

    round_ms: dict[int, float]  # one decode round (drafts verified), by k
    prefill_ms_per_token: float  # a cold prompt's prefill, per token
    keystroke_ms: float  # a prompt one keystroke longer than a cached one, to its first logits
    cpu_share: float = 1.0  # the process's CPU time while measuring ÷ (wall time × the threads it ran)
    head_ms: dict[int, float] = field(default_factory=dict)  # one call of the head by its rows (empty: not timed)

    @property
    def quiet(self) -> bool:
        """Nothing else competed for the cores while this was measured (a timing worth keeping)."""
        return self.cpu_share >= QUIET_CPU_SHARE

    def __post_init__(self) -> None:
        if not self.round_ms or any(v <= 0 or not math.isfinite(v) for v in self.round_ms.values()):
            raise ValueError(f"round times must be positive, got {self.round_ms}")
        if self.prefill_ms_per_token < 0 or self.keystroke_ms < 0:
            raise ValueError(f"prefill times must be >= 0, got {self.prefill_ms_per_token}, {self.keystroke_ms}")
        if not self.cpu_share >= 0:
            raise ValueError(f"cpu share must be >= 0, got {self.cpu_share}")
        if any(rows < 1 or not ms > 0 for rows, ms in self.head_ms.items()):
            raise ValueError(f"head times need rows >= 1 and ms > 0, got {self.head_ms}")


class FitCache(TimedEntries[MachineTiming]):
    """Timings measured before: a miss, never an error, where the file is missing, unreadable,
    foreign or old; the engine then measures, as without a cache."""

    def __init__(self, path: Path, max_age_s: float = FIT_CACHE_MAX_AGE_S, entries: int = FIT_CACHE_ENTRIES):
        super().__init__(path, max_age_s, entries, MachineTiming)


@dataclass(frozen=True)
class MachineDefaults:
    k: int
    max_tokens: int
    first_answer_ms: float
    round_ms: float  # at that k
    prefill_ms_per_token: float
    keystroke_ms: float
    prompt_tokens: int
    suffix_tokens: int  # of the prompt's, the text after the cursor at most

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


def choose_defaults(timing: MachineTiming, pinned_prompt_tokens: int | None = None) -> MachineDefaults:
    """What a typist needs on this machine; `pinned_prompt_tokens` (EngineConfig.prompt_tokens,
    when set) is the prompt budget instead of what prefills cold in `COLD_PROMPT_MS`."""
    k = next((k for k in K_CHOICES if tokens_ms(timing, k, FIRST_WORD_TOKENS) <= TARGET_FIRST_ANSWER_MS), MIN_K)
    low, high = FIRST_ANSWER_RANGE_MS
    round_ms = _round_ms(timing, k)
    # The engine answers at the end of the prompt's prefill (each branch's first token comes
    # with the prompt's logits: `keystroke_ms`) or after the first round that ends past the
    # moment: a moment exactly when a token is expected would wait a whole extra round
    # whenever the step that writes it ends a little early. Half a round before, that step is the one.
    first = min(high, max(low, timing.keystroke_ms - round_ms / 2))
    tokens = int(DECODE_BUDGET_MS / round_ms * TOKENS_PER_ROUND)
    max_tokens = min(MAX_TOKENS_RANGE[1], max(MAX_TOKENS_RANGE[0], tokens))
    fits = COLD_PROMPT_MS / timing.prefill_ms_per_token if timing.prefill_ms_per_token > 0 else PROMPT_TOKENS_RANGE[1]
    prompt_tokens = pinned_prompt_tokens or int(min(PROMPT_TOKENS_RANGE[1], max(PROMPT_TOKENS_RANGE[0], fits)))
    suffix_tokens = int(prompt_tokens * SUFFIX_SHARE)
    if pinned_prompt_tokens is None and timing.prefill_ms_per_token > 0:
        suffix_tokens = min(suffix_tokens, max(SUFFIX_TOKENS_MIN, int(SUFFIX_REREAD_MS / timing.prefill_ms_per_token)))
    return MachineDefaults(
        k, max_tokens, round(first), round(round_ms, 2), round(timing.prefill_ms_per_token, 3), round(timing.keystroke_ms, 2),
        prompt_tokens, suffix_tokens,
    )  # fmt: skip
