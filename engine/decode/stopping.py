"""When a branch's text is done: stop strings and the line rules for completions."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    """Cuts generated text. `stop_strings` end it where they first occur (the string is
    dropped); `single_line` ends it at the first newline; `block_indent` (start-of-line
    mode) ends it at a blank line or a line indented less than the cursor's block.

    `next_code_indent` (single-line mode at column 0, before a line of code indented this
    deep): a first line that opens a block (`for x in xs:`, `if (a) {`) no shallower than
    that code has no body below it, so the line is not the end: its body is written too,
    up to the first line back at the header's depth (a closing `}` there included).

    `before_clause` (the same, where that code is a clause that continues a block: `else:`,
    `except ...:`, `} catch (e) {`): the hole holds the block the clause continues, so a first
    line no deeper than the clause is not the end either: the text goes on down to a header at
    the clause's depth and its body, and ends before the line back at that depth (the clause's
    own, which the code after the cursor holds)."""

    stop_strings: tuple[str, ...] = ()
    single_line: bool = False
    block_mode: bool = False
    block_indent: int | None = None  # None in block mode: the indent of the first generated line
    next_code_indent: int | None = None
    before_clause: bool = False

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
                if self.before_clause and _indent(text[:newline]) <= (self.next_code_indent or 0):
                    end = min(end, self._clause_end(text))
                elif self._opens_bodiless_block(text[:newline]):
                    end = min(end, self._body_end(text, newline))
                else:
                    end = min(end, newline)
        if self.block_mode:
            end = min(end, self._block_end(text))
        return text[:end], end < len(text)

    def _opens_bodiless_block(self, first_line: str) -> bool:
        return (
            self.next_code_indent is not None
            and first_line.rstrip().endswith((":", "{"))
            and _HEADER.match(first_line) is not None
            and _indent(first_line) >= self.next_code_indent
        )

    def _clause_end(self, text: str) -> int:
        """Where a hole before a clause (`before_clause`) ends: after the body of the first header
        at the clause's depth, before the line back at that depth; before that header, at a blank
        line or a line shallower than the first."""
        offset, lines = 0, text.split("\n")
        first = _indent(lines[0])
        for index, line in enumerate(lines):
            if index == len(lines) - 1:
                return len(text)  # the last piece may still grow
            if not line.strip() or _indent(line) < first:
                return max(offset - 1, 0)
            if _indent(line) == self.next_code_indent and line.rstrip().endswith((":", "{")) and _HEADER.match(line):
                return offset + self._body_end(text[offset:], len(line), closes=False)
            offset += len(line) + 1
        return len(text)

    @staticmethod
    def _body_end(text: str, newline: int, closes: bool = True) -> int:
        """Where the block the first line (text[:newline]) opens ends: before a blank line or a
        line back at the header's depth, after that line where it closes a `{` block (with
        `closes`; else that line is the code after the cursor's)."""
        header = text[:newline]
        offset = newline + 1
        lines = text[offset:].split("\n")
        for index, line in enumerate(lines):
            if index == len(lines) - 1:
                return len(text)  # the last piece may still grow
            if not line.strip():
                return offset - 1
            if _indent(line) <= _indent(header):
                own_close = closes and header.rstrip().endswith("{") and line.strip().startswith("}")
                return offset + len(line) if own_close else offset - 1
            offset += len(line) + 1
        return len(text)

    def _block_end(self, text: str) -> int:
        offset = 0
        lines = text.split("\n")
        block_indent = self.block_indent
        for index, line in enumerate(lines):
            if block_indent is None and line.strip():
                block_indent = _indent(line)
            complete = index < len(lines) - 1  # the last piece may still grow
            if index > 0 and complete and not line.strip():
                return offset - 1  # blank line: end before its newline
            if index > 0 and line.strip():
                if _indent(line) < (block_indent or 0):
                    return offset - 1
            offset += len(line) + 1
        return len(text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


# A line that starts a compound statement (Python, and C-family `if (` / `for (` ...); not
# a name being assigned or used (`match = ...`, `case.x`: soft keywords are names too).
_HEADER = re.compile(r"[ \t]*(?:async[ \t]+)?(?:def|class|if|elif|else|for|while|with|try|except|finally|match|case|switch)\b(?![ \t]*[=.,)\]])")
_CLOSERS = frozenset(")]}")
# A line that continues a block the lines above it open (`else:`, `} catch (e) {`).
_CLAUSE = re.compile(r"[ \t]*(?:\}[ \t]*)?(?:else|elif|except|catch|finally)\b")


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
    Column 0 before a line of code: one line of its own (with its body where it opens a
    block the code after it is not the body of). Start of a line: finish the block that
    begins there."""
    line_before = prefix[prefix.rfind("\n") + 1 :]
    line_after = suffix.split("\n", 1)[0]
    if line_before.strip() and _opens_block(line_before, line_after):
        return StopRule(stop_strings=extra_stops, block_mode=True, block_indent=_indent(line_before) + 1)
    if not line_before and line_after.strip():  # a line of its own before that code
        clause = _CLAUSE.match(line_after) is not None
        return StopRule(stop_strings=extra_stops, single_line=True, next_code_indent=_indent(line_after), before_clause=clause)
    if line_before.strip() or line_after.strip():
        return StopRule(stop_strings=extra_stops, single_line=True)
    if not line_before:  # column 1: the first generated line sets the block's indent
        return StopRule(stop_strings=extra_stops, block_mode=True)
    return StopRule(stop_strings=extra_stops, block_mode=True, block_indent=len(line_before))
