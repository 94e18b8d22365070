"""One score per alternative, using the k together; duplicates merged; a stable best-first order.

score = logprob / n_tokens ** length_exponent       the model's confidence, per token where the
                                                     exponent is 1; at 0.7 a long run of easy tokens
                                                     (a comment, a whole loop header) no longer
                                                     outranks a short answer the model finds likelier
                                                     as a whole (`return False` at -1.3 over an `if`
                                                     line at -6.7)
        + agreement_weight * log(#agreeing)          branches whose shown text starts with the same
                                                     first line (this one included): the k vote
        + length_weight * log(1 + #non-blank chars)  a short safe guess is worth a little less
        + needed_name_weight * (#needed names it defines - #needed names it leaves undefined)
                                                     (names the code after the cursor reads and
                                                     nothing before defines; Python: pynames.py,
                                                     JavaScript/TypeScript: jsnames.py)
        + context_affinity_weight * affinity          after `module.`: the share of the member name's
                                                     words the code around the cursor holds
                                                     (members.py: `def parse_concat` -> `Concat`)
        - undefined_name_penalty * (#undefined names  (names it reads that nothing defines)
                                    + #certainly undefined)  (of those, the ones the window binds
                                                     only inside other functions: no name above
                                                     the window explains them; Python)
        - unused_variable_penalty * #unused variables
        - unfixed_error_penalty * [leaves an error the file had at the cursor]
        - beyond_window_penalty * [its brackets reach past the window's open end]
                                                     (window.end_balance: whether the file stays
                                                     whole cannot be seen)
        - syntax_error_penalty * [introduces a syntax error]
        - degenerate_penalty * [degenerate]           (degenerate.py: a loop, a run, a copy of the
                                                     lines above): below every sane alternative

The logprob is that of the whole generated text: the engine has no per-token split at the
trim point, and the trimmed-away tail is mostly what made the raw text long. The weights
were set on `kspec bench quality` (whole-file and windowed holes, k = 4): see docs/measurements/post-processing.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from kspec.engine.api import Completion
from kspec.engine.syntax.checks import CheckResult


@dataclass(frozen=True)
class RankConfig:
    syntax_error_penalty: float = 10.0
    unfixed_error_penalty: float = 5.0
    beyond_window_penalty: float = 5.0
    undefined_name_penalty: float = 2.0
    unused_variable_penalty: float = 1.0
    needed_name_weight: float = 0.5
    context_affinity_weight: float = 1.5
    length_weight: float = 0.02
    agreement_weight: float = 0.25
    degenerate_penalty: float = 1000.0
    length_exponent: float = 0.7  # 1: the mean per token, 0: the sum (docs/measurements/zen4-length-exponent.md)

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RankConfig.{item.name} must be a finite number >= 0, got {value!r}")
        if self.length_exponent > 1:
            raise ValueError(f"RankConfig.length_exponent must be at most 1 (1: the mean per token), got {self.length_exponent!r}")


@dataclass(frozen=True)
class Signals:
    """What is known about one alternative when it is scored."""

    completion: Completion  # the shown text, with the log-probability and tokens of the whole generated text
    check: CheckResult
    agreeing: int = 1  # alternatives whose shown text has the same first line, this one included
    degenerate: bool = False
    affinity: float = 0.0  # after `module.`: MemberNames.affinity of the name it writes


def normalized_logprob(logprob: float, n_tokens: int, exponent: float = 1.0) -> float:
    """logprob / n_tokens ** exponent (1: the mean per token); -1e9 for a non-finite logprob."""
    if not math.isfinite(logprob):
        return -1e9
    return logprob / max(n_tokens, 1) ** exponent


def dedupe_key(text: str) -> str:
    """Equal keys mean the same suggestion: all whitespace runs collapse to one space."""
    return " ".join(text.split())


def first_line_key(text: str) -> str:
    """What alternatives that agree share: the first non-blank line, whitespace-normalised."""
    for line in text.split("\n"):
        if line.strip():
            return dedupe_key(line)
    return ""


def score(signals: Signals, config: RankConfig) -> float:
    """The documented score (module docstring); higher is better."""
    check, completion = signals.check, signals.completion
    value = normalized_logprob(completion.logprob, completion.n_tokens, config.length_exponent)
    value += config.agreement_weight * math.log(max(signals.agreeing, 1))
    value += config.length_weight * math.log1p(sum(1 for c in completion.text if not c.isspace()))
    value += config.needed_name_weight * (len(check.needs_defined) - len(check.needs_missing))
    value += config.context_affinity_weight * signals.affinity
    value -= config.undefined_name_penalty * (len(check.undefined_names) + len(check.certainly_undefined))
    value -= config.unused_variable_penalty * len(check.unused_variables)
    value -= config.unfixed_error_penalty * (1 if check.unfixed_errors else 0)
    value -= config.beyond_window_penalty * (1 if check.beyond_window else 0)
    value -= config.syntax_error_penalty * (1 if check.breaks_parse else 0)
    value -= config.degenerate_penalty * (1 if signals.degenerate else 0)
    return value


@dataclass(frozen=True)
class Ranked:
    """A shown alternative with what was found about it."""

    completion: Completion  # the shown text, its score (`score`) and what decoding said of it
    check: CheckResult
    agreeing: int  # alternatives that trimmed to the same text (this one included)
    source_index: int  # the alternative it came from, in the engine's list (ties keep this order)
    partial: bool = False  # a partial answer (the name of a call it opened, postprocess.Trimmed.name_only): after the whole ones


def best_first(items: list[Ranked]) -> list[Ranked]:
    """Whole answers before partial ones, each best first (equal scores keep the engine's order),
    one per `dedupe_key`: the first, with the agreeing counts of those dropped added."""
    kept: dict[str, Ranked] = {}
    for item in sorted(items, key=lambda item: (item.partial, -item.completion.score, item.source_index)):
        key = dedupe_key(item.completion.text)
        first = kept.get(key)
        kept[key] = item if first is None else replace(first, agreeing=first.agreeing + item.agreeing)
    return list(kept.values())
