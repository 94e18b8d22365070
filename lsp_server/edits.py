"""How much of the text right of the cursor a suggestion replaces.

An editor that auto-closes brackets leaves `foo(|)`; a suggestion `a, b)` must replace
that `)` rather than produce `foo(a, b))`. Two rules, both safe (nothing right of the
cursor disappears unless the suggestion writes it again, in the same order):

1. the suggestion ends with the rest of the line (ignoring trailing blanks): it replaces
   the whole rest of the line;
2. otherwise the longest run of closers (brackets, quotes, `;` `,` `:` and blanks) at
   the start of the rest of the line whose characters all appear, in order, in the
   suggestion is replaced.
"""

from __future__ import annotations

CLOSERS = frozenset(")]}>\"'`;,: \t")


def replaced_chars(text: str, line_suffix: str) -> int:
    """Characters of `line_suffix` (the rest of the cursor's line) that `text` replaces."""
    if not line_suffix or not text:
        return 0
    tail = line_suffix.rstrip()
    if tail and text.endswith(tail):
        return len(line_suffix)
    matched = 0
    position = 0
    for char in line_suffix:
        if char not in CLOSERS:
            break
        found = text.find(char, position)
        if found < 0:
            break
        position = found + 1
        matched += 1
    # Blanks alone are not worth replacing, and a replaced run never ends in a blank the
    # suggestion did not write (that would glue the following text to the suggestion).
    while matched and line_suffix[matched - 1] in " \t":
        matched -= 1
    return matched
