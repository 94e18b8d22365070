"""One score per alternative, duplicates merged, a stable best-first order.

score = logprob / n_tokens                      (the model's confidence, length-normalised)
        - syntax_error_penalty  * [introduces a syntax error]
        - unfixed_error_penalty * [leaves an error the file had at the cursor]
        - undefined_name_penalty * (#undefined names)
        - unused_variable_penalty * (#unused variables)
        + length_weight * log(1 + #non-blank chars)   (a short safe guess is worth less)
        + agreement_weight * log(#alternatives with the same text)  (branches that agree)

The logprob is that of the whole generated text: the engine has no per-token split at the
trim point, and the trimmed-away tail is mostly what made the raw text long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kspec.engine.syntax.checks import CheckResult


@dataclass(frozen=True)
class RankConfig:
    syntax_error_penalty: float = 10.0
    unfixed_error_penalty: float = 5.0
    undefined_name_penalty: float = 2.0
    unused_variable_penalty: float = 1.0
    length_weight: float = 0.05
    agreement_weight: float = 0.25

    def __post_init__(self) -> None:
        for name in (
            "syntax_error_penalty", "unfixed_error_penalty", "undefined_name_penalty", "unused_variable_penalty",
            "length_weight", "agreement_weight",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RankConfig.{name} must be a finite number >= 0, got {value!r}")


def normalized_logprob(logprob: float, n_tokens: int) -> float:
    if not math.isfinite(logprob):
        return -1e9
    return logprob / max(n_tokens, 1)


def dedupe_key(text: str) -> str:
    """Equal keys mean the same suggestion: all whitespace runs collapse to one space."""
    return " ".join(text.split())


def score(
    text: str, logprob: float, n_tokens: int, check: CheckResult, agreeing: int, config: RankConfig
) -> float:
    value = normalized_logprob(logprob, n_tokens)
    value -= config.syntax_error_penalty * (1 if check.breaks_parse else 0)
    value -= config.unfixed_error_penalty * (1 if check.unfixed_errors else 0)
    value -= config.undefined_name_penalty * len(check.undefined_names)
    value -= config.unused_variable_penalty * len(check.unused_variables)
    value += config.length_weight * math.log1p(sum(1 for c in text if not c.isspace()))
    value += config.agreement_weight * math.log(max(agreeing, 1))
    return value


@dataclass(frozen=True)
class Scored:
    index: int  # position of the alternative in the engine's list (ties keep this order)
    text: str
    score: float
    check: CheckResult
    agreeing: int  # alternatives that trimmed to the same text (this one included)


def order(items: list[Scored]) -> list[Scored]:
    """Best first; equal scores keep the engine's order."""
    return sorted(items, key=lambda item: (-item.score, item.index))
