"""When a branch's text is done: stop strings and the line rules for completions."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """Cuts generated text. `stop_strings` end it where they first occur (the string is
    dropped); `single_line` ends it at the first newline; `block_indent` (start-of-line
    mode) ends it at a blank line or a line indented less than the cursor's block."""

    stop_strings: tuple[str, ...] = ()
    single_line: bool = False
    block_mode: bool = False
    block_indent: int | None = None  # None in block mode: the indent of the first generated line

    def cut(self, text: str) -> tuple[str, bool]:
        """(text up to the stop, whether a stop was found)."""
        end = len(text)
        for stop in self.stop_strings:
            index = text.find(stop)
            if index != -1:
                end = min(end, index)
        if self.single_line:
            newline = text.find("\n")
            if newline != -1:
                end = min(end, newline)
        if self.block_mode:
            end = min(end, self._block_end(text))
        return text[:end], end < len(text)

    def _block_end(self, text: str) -> int:
        offset = 0
        lines = text.split("\n")
        block_indent = self.block_indent
        for index, line in enumerate(lines):
            if block_indent is None and line.strip():
                block_indent = len(line) - len(line.lstrip(" \t"))
            complete = index < len(lines) - 1  # the last piece may still grow
            if index > 0 and complete and not line.strip():
                return offset - 1  # blank line: end before its newline
            if index > 0 and line.strip():
                indent = len(line) - len(line.lstrip(" \t"))
                if indent < (block_indent or 0):
                    return offset - 1
            offset += len(line) + 1
        return len(text)


# A line that starts a compound statement (Python, and C-family `if (` / `for (` ...); not
# a name being assigned or used (`match = ...`, `case.x`: soft keywords are names too).
_HEADER = re.compile(r"[ \t]*(?:async[ \t]+)?(?:def|class|if|elif|else|for|while|with|try|except|finally|match|case|switch)\b(?![ \t]*[=.,)\]])")
_CLOSERS = frozenset(")]}")


def _opens_block(line_before: str, line_after: str) -> bool:
    """The cursor ends a header line (`for x in y:`, `if (a) {`) or is inside one still
    being written (`def total(self` with at most closing brackets after it): what comes
    next is the rest of the header and the block's body, on the lines below."""
    rest = line_after.strip()
    if not rest and line_before.rstrip().endswith((":", "{")):
        return True
    return all(char in _CLOSERS for char in rest) and _HEADER.match(line_before) is not None and not line_before.rstrip().endswith(";")


def rule_for_cursor(prefix: str, suffix: str, extra_stops: tuple[str, ...] = ()) -> StopRule:
    """Mid-line cursor: finish the line; on (or inside) a line that opens a block, the rest
    of that line and the body below it (as far as it is indented deeper than the line).
    Start of a line: finish the block that begins there."""
    line_before = prefix[prefix.rfind("\n") + 1 :]
    line_after = suffix.split("\n", 1)[0]
    if line_before.strip() and _opens_block(line_before, line_after):
        indent = len(line_before) - len(line_before.lstrip(" \t"))
        return StopRule(stop_strings=extra_stops, block_mode=True, block_indent=indent + 1)
    if line_before.strip() or line_after.strip():
        return StopRule(stop_strings=extra_stops, single_line=True)
    if not line_before:  # column 1: the first generated line sets the block's indent
        return StopRule(stop_strings=extra_stops, block_mode=True)
    return StopRule(stop_strings=extra_stops, block_mode=True, block_indent=len(line_before))
