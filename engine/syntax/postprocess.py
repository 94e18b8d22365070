"""Trim, check, deduplicate and rank the k alternatives of one request.

The alternatives are `Completion`s from decoding to the shown list: trimming replaces their text,
ranking fills in their score (`dataclasses.replace`), so one type carries an answer's text all the way.
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple
from dataclasses import dataclass, field, replace

from kspec.engine.api import Completion
from kspec.engine.syntax.checks import Checker, CheckResult
from kspec.engine.syntax.context import CursorContext, build_context, indent_of, opens_block
from kspec.engine.syntax.languages import normalize_language
from kspec.engine.syntax.members import MemberNames
from kspec.engine.syntax.degenerate import degeneration
from kspec.engine.syntax import jsnames
from kspec.engine.syntax.pynames import module_names
from kspec.engine.syntax.rank import (
    RankConfig, Ranked, Signals, best_first, dedupe_key, first_line_key, normalized_logprob, score,
)
from kspec.engine.syntax.trim import END, Cut, before_open_call, drop_truncated_line, find_cut, finalize, under_block_opener, without_stutter
from kspec.engine.syntax.memo import request_memo
from kspec.engine.syntax.window import EndBalance, crop, end_balance


@dataclass(frozen=True)
class PostprocessConfig:
    # A suggestion that breaks the file is worse than none: drop those that introduce a
    # syntax error, and those that leave the file broken when another alternative leaves
    # it whole.
    drop_broken: bool = True
    # Also drop those that leave the file broken at the cursor where it already was (the
    # hole needs more than the unit: a block header whose body the suffix has, more than
    # one statement) even when no alternative does better; off, only those the budget cut
    # short are dropped.
    drop_unfilled: bool = True
    # Line ends tried, before and after the cut, when the trimmed text does not leave the
    # file whole (each costs one incremental reparse).
    max_fallbacks: int = 4
    # Also drop those that bind a name nothing reads and leave a name the suffix needs unbound
    # (`CheckResult.binds_the_wrong_name`; Python, where unused variables are checked): a wrong
    # assignment misleads more than no suggestion.
    drop_wrong_binding: bool = True
    check_names: bool = True  # undefined and needed names (Python, JavaScript/TypeScript); Python: unused variables
    rank: RankConfig = field(default_factory=RankConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.max_fallbacks, int) or self.max_fallbacks < 0:
            raise ValueError(f"PostprocessConfig.max_fallbacks must be an int >= 0, got {self.max_fallbacks!r}")
        if not isinstance(self.rank, RankConfig):
            raise ValueError("PostprocessConfig.rank must be a RankConfig")


DEFAULT_CONFIG = PostprocessConfig()


TRUNCATED = frozenset({"length", "deadline"})  # finish reasons that cut a text mid-thought


class Analysis:
    """What one request's window determines, built once per request (`analysis`): the cursor
    context, the checker with its baseline, and the checks of the texts already seen
    (interim answers post-process the same request again)."""

    def __init__(self, prefix: str, suffix: str, language: str | None, above: frozenset[str] = frozenset()) -> None:
        """`prefix` / `suffix`: the window (`crop`); `above`: names of the file above it (`Checker`)."""
        self.prefix, self.suffix, self.language = prefix, suffix, language
        self.ctx = build_context(prefix, suffix, language)
        self.checker = Checker(prefix, suffix, language, self.ctx, above)
        self._checked: dict[tuple[str, bool], CheckResult] = {}
        self._lock = threading.Lock()  # the checker's parser parses one text at a time

    def check(self, text: str, names: bool) -> CheckResult:
        with self._lock:
            result = self._checked.get((text, names))
            if result is None:
                result = self._checked[(text, names)] = self.checker.check(text, names=names)
        return result

    def leaves_whole(self, result: CheckResult) -> bool:
        return self.language is None or self.checker.leaves_whole(result)

    def end_balance(self, completion: str) -> EndBalance:
        if self.language is None:
            return EndBalance(len(completion), False)
        return end_balance(self.prefix, self.suffix, self.language, completion)


@request_memo
def analysis(prefix: str, suffix: str, language: str | None, outside: frozenset[str] = frozenset()) -> Analysis:
    """The analysis of the window `crop` keeps around the cursor (`language`: canonical or None);
    `outside`: names the file binds outside `prefix` and `suffix` (`CompletionRequest.outside_names`)."""
    start, end = crop(prefix, suffix)
    above = outside
    if start > 0 and language == "python":
        above |= module_names(prefix[:start])
    elif start > 0 and language in jsnames.LANGUAGES:
        above |= jsnames.words(prefix[:start])
    return Analysis(prefix[start:], suffix[:end], language, above)


class Trimmed(NamedTuple):
    completion: Completion  # the alternative with its text trimmed
    check: CheckResult
    name_only: bool = False  # the name of a call the candidate opened and did not finish (`Message(` -> `Message`)


def trim_and_check(request: Analysis, candidate: Completion, config: PostprocessConfig) -> Trimmed | None:
    """The alternative with its text trimmed, and that text's check.

    If the trimmed text does not leave the file whole (`Checker.leaves_whole`: errors the
    window had away from the hole are not held against it), other cuts are tried: earlier line
    ends inside the unit (when it breaks the parse), then later line ends of the completion
    (a hole that needs more than one statement), then a one-line text without the block opener
    it ends with (`_opener_dropped`); the first that leaves the file whole wins,
    else the first of those that break nothing that leaves the fewest errors at the cursor, then
    in all (a window whose end the hole cannot mend), else the trimmed text. When none leaves it
    whole and the text ends by opening a call on a name (`Message(`, cut at the newline before
    its arguments), the name alone is taken if that leaves the file whole: a partial answer
    (`name_only`), shown after the whole ones, rather than none.
    """
    ctx = request.ctx
    completion = candidate.text
    if candidate.finish_reason in TRUNCATED:
        completion = drop_truncated_line(completion)
    completion = without_stutter(ctx.line_prefix, completion)
    balance = request.end_balance(completion)
    completion = completion[: balance.keep]
    cut = find_cut(ctx, completion, final=True) or Cut(len(completion), END)

    def attempt(option: Cut | int) -> Trimmed | None:
        text = finalize(ctx, completion, option)
        if text is None:
            return None
        result = request.check(text, config.check_names)
        return Trimmed(replace(candidate, text=text), replace(result, beyond_window=True) if balance.unsure else result)

    def clean(found: Trimmed | None) -> bool:
        return found is not None and request.leaves_whole(found.check)

    def fills_more(found: Trimmed, than: Trimmed) -> bool:  # fewer errors left at the cursor (an `else` without its `if`), then in all
        return (found.check.unfixed_at_cursor, found.check.unfixed_errors) < (than.check.unfixed_at_cursor, than.check.unfixed_errors)

    first = attempt(cut)
    if first is None or clean(first):
        return first
    if (moved := under_block_opener(request.prefix, ctx, candidate.text)) is not None:
        found = trim_and_check(request, replace(candidate, text=moved), config)  # moved once: deeper than the opener now
        if clean(found):
            return found
    earlier = list(cut.line_ends[: config.max_fallbacks]) if first.check.breaks_parse else []
    header = header_for_suffix(ctx, completion) if first.check.unfixed_at_cursor and not earlier else None
    later = [m.start() for m in _NEWLINE.finditer(completion, cut.end + 1)][: config.max_fallbacks]
    fallback = None if first.check.breaks_parse else first
    for option in [*earlier, *([header] if header is not None else []), *later, len(completion), *_opener_dropped(completion)]:
        found = attempt(option)
        if clean(found):
            return found
        if found is not None and not found.check.breaks_parse and (fallback is None or fills_more(found, fallback)):
            fallback = found
    if (name_end := before_open_call(ctx, completion[: cut.end])) is not None:
        found = attempt(name_end)
        if found is not None and clean(found):
            return found._replace(name_only=True)
    return fallback or first


_NEWLINE = re.compile("\n")
TRAILING_OPENERS = ":{"  # a block opener a one-line answer may end with where its statement takes none


def _opener_dropped(completion: str) -> list[int]:
    """A one-line answer without the block opener it ends with, as a last cut to try: the model
    took the line for a header (`have_extends = node.find(nodes.` + `Extends):`); taken only where
    that leaves the file whole."""
    text = completion.rstrip()
    return [len(text) - 1] if text and text[-1] in TRAILING_OPENERS and "\n" not in text else []


def header_for_suffix(ctx: CursorContext, completion: str) -> int | None:
    """The end of the completion's first line when that line opens a block whose body the
    suffix already holds: the cursor is at a line end, the suffix's next line is indented
    deeper than the completion's first line, and that line's code ends with a block opener
    (`for (...) {`, `if x:`). The unit the completion wrote after it (its own body and close)
    then leaves the suffix's body without a header; cut after the header it is the hole's
    fill. None otherwise."""
    newline = completion.find("\n")
    if newline <= 0 or ctx.mid_line or ctx.suffix_line_rest.strip() or ctx.suffix_next_indent is None:
        return None
    first_line = ctx.line_prefix + completion[:newline]
    if not opens_block(first_line, ctx.spec):
        return None
    return newline if ctx.suffix_next_indent > indent_of(first_line) else None


def rank_alternatives(
    prefix: str, suffix: str, language: str | None, candidates: list[Completion], *,
    raw: bool = False, config: PostprocessConfig = DEFAULT_CONFIG, members: MemberNames | None = None,
    outside: frozenset[str] = frozenset(),
) -> list[Ranked]:
    """`postprocess` with the checks kept (for benchmarks and debugging)."""
    if raw:
        return _raw(candidates)
    request = analysis(prefix, suffix, normalize_language(language), outside)
    writing_at_end = not request.suffix.strip()
    groups: dict[str, list[Ranked]] = {}  # dedupe key -> the trimmed alternatives with that text, not scored yet
    first_lines: dict[str, int] = {}  # first-line key -> trimmed alternatives that start with it
    for index, candidate in enumerate(candidates):
        trimmed = trim_and_check(request, candidate, config)
        if trimmed is None:
            continue
        completion, result, name_only = trimmed
        unknown = members.unknown(completion.text) if members is not None else None
        if unknown is not None:  # after `nodes.`, a name the module does not have
            result = replace(result, undefined_names=(*result.undefined_names, unknown))
        first_lines[first_line_key(completion.text)] = first_lines.get(first_line_key(completion.text), 0) + 1
        # At the end of the document (blank suffix) the construct being typed is open by
        # nature (a def header's body comes next): only a budget-cut text counts as unfilled.
        unfilled = result.unfixed_at_cursor > 0 and (
            (config.drop_unfilled and not writing_at_end) or candidate.finish_reason in TRUNCATED
        )
        if config.drop_broken and (result.breaks_parse or unfilled):
            continue  # broken, or leaves the hole at the cursor unfilled
        if config.drop_wrong_binding and result.binds_the_wrong_name:
            continue
        groups.setdefault(dedupe_key(completion.text), []).append(Ranked(completion, result, 1, index, partial=name_only))

    scored: list[Ranked] = []
    for group in groups.values():
        # The group's representative: the most confident of it (the engine's order breaks ties).
        best = max(group, key=lambda item: (normalized_logprob(item.completion.logprob, item.completion.n_tokens), -item.source_index))
        signals = Signals(
            best.completion, best.check,
            agreeing=first_lines[first_line_key(best.completion.text)],
            degenerate=degeneration(best.completion.text, request.prefix) is not None,
            affinity=members.affinity(best.completion.text) if members is not None else 0.0,
        )
        scored.append(replace(best, completion=replace(best.completion, score=score(signals, config.rank)), agreeing=len(group)))
    if config.drop_broken and any(item.check.unfixed_errors == 0 for item in scored):
        # Some alternative leaves the file whole (it fills the hole): those that leave it
        # broken are not worth showing next to it.
        scored = [item for item in scored if item.check.unfixed_errors == 0]
    if config.drop_broken and any(not item.check.beyond_window for item in scored):
        # Nor are those whose brackets reach past the window's end, where it cannot be seen
        # whether the file stays whole, next to one the window vouches for.
        scored = [item for item in scored if not item.check.beyond_window]
    return best_first(scored)


def _raw(candidates: list[Completion]) -> list[Ranked]:
    """Untrimmed texts by length-normalised log-probability, one per `dedupe_key`: branches
    that began with different tokens can still detokenize to the same text."""
    items = [Ranked(replace(c, score=normalized_logprob(c.logprob, c.n_tokens)), CheckResult(), 1, i) for i, c in enumerate(candidates)]
    return best_first(items)


def postprocess(
    prefix: str, suffix: str, language: str | None, candidates: list[Completion], *,
    raw: bool = False, config: PostprocessConfig = DEFAULT_CONFIG, members: MemberNames | None = None,
    outside: frozenset[str] = frozenset(),
) -> list[Completion]:
    """Trim, check, deduplicate and rank `candidates` (decoding's alternatives, their `score` not set
    yet); best first, each with its trimmed text and its score.

    `language`: a canonical name or an LSP languageId; None or unknown means line-based
    trimming and no checks. `prefix` and `suffix` may be a window of the file, cut anywhere
    (window.py); of a longer text, a window of `window.MAX_BEFORE` / `MAX_AFTER` characters
    around the cursor is analysed. With `raw=True` the texts are returned untrimmed and
    unchecked, one per `dedupe_key`, ordered by length-normalised log-probability (what the
    model alone would show). Ranking: rank.py's one score, which uses the k together.
    Left out (so the list may be shorter than k, or empty): alternatives that trim to
    nothing or duplicate a better one, unless `config.drop_broken` is off, those that
    introduce a syntax error, those that leave the file broken at the cursor where it
    already was (`config.drop_unfilled`), and those that leave it broken elsewhere when
    another alternative leaves it whole; and unless `config.drop_wrong_binding` is off, those
    that assign a name nothing reads where the suffix needs another one bound.
    `members`: where the cursor follows `module.` of an imported module, its names: an
    alternative that writes another counts one more undefined name. `outside`: the names the
    file binds outside `prefix` and `suffix` (`CompletionRequest.outside_names`), taken as defined.
    """
    ranked = rank_alternatives(prefix, suffix, language, candidates, raw=raw, config=config, members=members, outside=outside)
    return [r.completion for r in ranked]
