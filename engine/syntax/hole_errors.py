"""Which error nodes of a completed window are the completion's: those it introduces, those the
window had and still has (unfixed), and of those, the ones at the hole (the cursor's statement
and the suffix's next lines). The rule behind `Checker.check`'s syntax counts (checks.py)."""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter

from kspec.engine.syntax.context import indent_of

ErrorSignature = tuple[str, int, int]  # (kind, start, end), see `error_signature`


def error_nodes(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    """ERROR and MISSING nodes, visiting only subtrees that contain one."""
    found: list[tree_sitter.Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            found.append(node)
            if node.is_missing:
                continue
        if node.has_error:
            stack.extend(child for child in node.children if child.has_error or child.is_missing)
    return found


def error_signature(node: tree_sitter.Node, cursor: int, inserted: int) -> ErrorSignature:
    """(kind, start, end) of an error node of a parse with `inserted` bytes at `cursor`, in the
    coordinates of the text without them; -1 for a place inside the inserted text."""
    end_of_completion = cursor + inserted

    def mapped(position: int) -> int:
        if position <= cursor:
            return position
        if position >= end_of_completion:
            return position - inserted
        return -1

    kind = ("MISSING " + node.type) if node.is_missing else "ERROR"
    return kind, mapped(node.start_byte), mapped(node.end_byte)


def missing_by_kind(errors: set[ErrorSignature]) -> dict[str, list[int]]:
    """Where each kind of MISSING node starts, in order."""
    missing: dict[str, list[int]] = {}
    for kind, start, _ in sorted(errors):
        if kind.startswith("MISSING"):
            missing.setdefault(kind, []).append(start)
    return missing


@dataclass(frozen=True)
class Hole:
    """Where, in the bytes of the repaired window without the completion, the errors a hole
    causes show up: from the start of the statement the cursor is in to the end of the suffix's
    next few lines (a body without its header, a stray `}`)."""

    text: bytes  # the repaired prefix + suffix
    cursor: int
    statement: int  # where the cursor's statement starts
    near_end: int  # where the suffix's next lines end
    last_line: int  # where the window's last line starts if the window cut it short (else its end)
    indent: int  # the cursor's line's indentation

    def has(self, start: int, end: int) -> bool:
        """Whether an error the file had is the hole's: it starts in the cursor's statement,
        reaches the cursor, and starts before the suffix's next lines end and before the
        window's last line (which the window may have cut); one that starts after the cursor
        does so on a line indented at least as deep as the cursor's (a line indented less is
        outside the hole's block: what breaks there is the window's structure)."""
        if not (self.statement <= start <= self.near_end and end >= self.cursor):
            return False
        if start <= self.cursor:
            return True
        if start >= self.last_line:
            return False
        line_start = self.text.rfind(b"\n", 0, start) + 1
        return indent_of(self.text[line_start:start].decode("utf-8", "replace")) >= self.indent


class BaselineErrors:
    """The error nodes of the window without the completion, against which a completed window's
    are judged."""

    def __init__(self, root: tree_sitter.Node, hole: Hole) -> None:
        self.hole = hole
        self.errors = {error_signature(node, hole.cursor, 0) for node in error_nodes(root)}
        self.missing = missing_by_kind(self.errors)
        # Errors of the window away from the hole that its repair does not mend (an `except`
        # whose `try` the cut removed): no completion is expected to mend them.
        self.away_from_hole = sum(not hole.has(start, end) for _, start, end in self.errors)

    def count(self, root: tree_sitter.Node, inserted: int) -> tuple[int, int, int]:
        """(new, unfixed, unfixed at the cursor) error nodes of the completed window (`root`, with
        `inserted` bytes at the cursor).

        New: not explained by an error of prefix + suffix. An ERROR explains another when its
        span (completion taken out) contains it: error recovery often re-cuts a pre-existing
        ERROR node once text is inserted before it. A MISSING node is explained by one of the
        same kind the file had, each once (the same place first): recovery puts a missing `}`
        after the last token, which moves when text is inserted there. Any error with an
        end inside the completion is the completion's, and so is one that reaches the
        cursor; one that starts before the statement the cursor is in and ends before the
        cursor is the window's (text the completion did not touch, re-cut). Unfixed:
        explained, i.e. the file had it before; at the cursor when the one the file had
        starts in the cursor's statement and reaches into the cursor's next lines.
        """
        hole = self.hole
        new = unfixed = at_cursor = 0
        missing_left = {kind: list(places) for kind, places in self.missing.items()}
        for node in error_nodes(root):
            kind, start, end = error_signature(node, hole.cursor, inserted)
            if node.is_missing and missing_left.get(kind):
                places = missing_left[kind]
                old = start if start in places else places[0]
                places.remove(old)
                unfixed += 1
                at_cursor += hole.has(old, old + 1)
                continue
            explained = start != -1 and end != -1 and any(
                old_start <= start and end <= old_end for _, old_start, old_end in self.errors
            )
            if not explained and (end == -1 or start == -1 or start >= hole.statement or end >= hole.cursor):
                new += 1
            else:
                unfixed += 1
                at_cursor += hole.has(start, end)
        return new, unfixed, at_cursor
