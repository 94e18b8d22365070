"""The cursor's context for the engine: prefix and suffix under character budgets, and for
Python the names the file binds at module level outside them.

Only the lines around the cursor are joined, so a huge document costs little more than a
small one (apart from `offset`, one sum over the line lengths before the cursor, and a Python
file's module-level names: one line-anchored regex over the rest of the file, ~3 ms for 300 KB).
"""

from __future__ import annotations

from dataclasses import dataclass

from kspec.engine.syntax.languages import detect_language
from kspec.engine.syntax.pynames import outside_names
from kspec.engine.syntax.window import MAX_AFTER, MAX_BEFORE
from kspec.lsp_server.documents import Cursor, Document, line_body


@dataclass(frozen=True)
class Budgets:
    prefix_chars: int = MAX_BEFORE
    suffix_chars: int = MAX_AFTER

    def __post_init__(self) -> None:
        if self.prefix_chars < 1 or self.suffix_chars < 0:
            raise ValueError(f"budgets must be positive, got {self.prefix_chars}, {self.suffix_chars}")


@dataclass(frozen=True)
class EditorContext:
    prefix: str  # the last `prefix_chars` characters before the cursor
    suffix: str  # the first `suffix_chars` characters after it
    line_suffix: str  # the rest of the cursor's line, without its terminator
    offset: int  # code points before the cursor in the document
    length: int  # code points in the document
    outside_names: tuple[str, ...] = ()  # Python: what the file binds at module level outside prefix and suffix


def editor_context(document: Document, cursor: Cursor, budgets: Budgets) -> EditorContext:
    lines = document.lines
    current = lines[cursor.line]
    pieces = [current[: cursor.column]]
    size = cursor.column
    line = cursor.line - 1
    while size < budgets.prefix_chars and line >= 0:
        pieces.append(lines[line])
        size += len(lines[line])
        line -= 1
    prefix = "".join(reversed(pieces))[-budgets.prefix_chars :]

    pieces = [current[cursor.column :]]
    size = len(pieces[0])
    line = cursor.line + 1
    while size < budgets.suffix_chars and line < len(lines):
        pieces.append(lines[line])
        size += len(lines[line])
        line += 1
    suffix = "".join(pieces)[: budgets.suffix_chars]
    offset = document.offset(cursor)
    outside: tuple[str, ...] = ()
    if len(prefix) + len(suffix) < document.length and detect_language(document.language_id, document.uri) == "python":
        outside = outside_names(document.text, offset - len(prefix), offset + len(suffix))
    return EditorContext(
        prefix=prefix,
        suffix=suffix,
        line_suffix=line_body(current)[cursor.column :],
        offset=offset,
        length=document.length,
        outside_names=outside,
    )


def looks_binary(context: EditorContext) -> bool:
    """NUL characters near the cursor: a binary file opened as text."""
    return "\0" in context.prefix or "\0" in context.suffix
