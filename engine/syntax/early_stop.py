"""The early-stop hook: has a branch finished the unit it was writing?

Decoding asks this once per round per branch, so it must be cheap: it is lexical only
(no parse: tens of microseconds), and the cursor context of a request is built once
(`UnitPredicate`, or the memo behind `build_context`, which post-processing then shares).
A branch is complete when text after the point where trimming would cut shows the unit
is over (a line at a dedent, a repeat of the suffix, a closing bracket the suffix already
has); what trimming would keep is then already in the text, so more tokens only cost time.
"""

from __future__ import annotations

from kspec.engine.syntax.context import CursorContext, build_context
from kspec.engine.syntax.trim import find_cut


class UnitPredicate:
    """`predicate(completion_so_far) -> bool` for one request's prefix and suffix."""

    def __init__(self, prefix: str, suffix: str, language: str | None) -> None:
        self.ctx: CursorContext = build_context(prefix, suffix, language)

    def __call__(self, completion_so_far: str) -> bool:
        return is_unit_complete(self.ctx, completion_so_far)


def is_unit_complete(ctx: CursorContext, completion_so_far: str) -> bool:
    cut = find_cut(ctx, completion_so_far, final=False)
    if cut is None:
        return False
    # Something non-blank after the cut proves the unit is over; a cut at the very end
    # (nothing after it yet) does not.
    return completion_so_far[cut.end :].strip() != ""


def unit_complete(prefix: str, completion_so_far: str, suffix: str, language: str | None) -> bool:
    """True when this branch has completed its unit and decoding it further is wasted work."""
    if not completion_so_far.strip():
        return False
    return is_unit_complete(build_context(prefix, suffix, language), completion_so_far)
