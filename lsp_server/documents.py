"""Open documents: incremental sync over a list of lines, and LSP position encodings.

A document is a list of lines; every line but the last keeps its terminator ("\\n",
"\\r\\n" or "\\r": the only line breaks LSP knows), so an edit touches a few lines and
a cursor's context is read from the lines around it, whatever the file's size.

Positions are (line, character) where `character` counts UTF-16 code units (the LSP
default), UTF-8 bytes or code points (UTF-32), as negotiated at `initialize`. Inside the
server a column is a code-point index into the line without its terminator. A character
past the end of a line means the end of that line (LSP says so); a position inside a
surrogate pair or a multi-byte sequence is rounded down to the character it splits.

kspec's own log files are never documents here: "kspec: Show log" opens the engine daemon's log
in an editor tab, and the editor tells the server about it like any document. A document is one
of kspec's logs when its language is `log` (VS Code's language for `*.log` files), or it is a
`.log` file in kspec's runtime folder (runtime.py: `$XDG_RUNTIME_DIR/kspec`, else `kspec-$UID` in
the temp folder) or in the folder of the engine's own log file (a folder the settings chose). The
store remembers it as a log and keeps no text: it gets no completions and is no other file's context.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kspec.engine.errors import InputError

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)
MAX_DOCUMENT_CHARS = 32 * 1024 * 1024  # beyond this a document is tracked as "too large" and gets no completions

LOG_LANGUAGE = "log"

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Lone surrogates (JSON allows "\\ud800") become U+FFFD: same length in every encoding."""
    return _SURROGATE.sub("\ufffd", text)


def split_lines(text: str) -> list[str]:
    """Lines with their terminators; the last one has none (and may be empty)."""
    lines = _LINE.findall(text)
    if not lines or lines[-1].endswith(("\n", "\r")):
        lines.append("")
    return lines


def line_body(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


def column_from_units(body: str, units: int, encoding: str) -> int:
    """Code-point column for `units` of `encoding` into `body`, clamped to the line, rounded down."""
    if units <= 0:
        return 0
    if encoding == UTF32 or body.isascii():
        return min(units, len(body))
    if encoding == UTF16:
        head = body.encode("utf-16-le", "surrogatepass")[: 2 * units].decode("utf-16-le", "surrogatepass")
        if head and "\ud800" <= head[-1] <= "\udbff":  # cut inside a surrogate pair
            return len(head) - 1
        return len(head)
    if encoding == UTF8:
        return len(body.encode("utf-8")[:units].decode("utf-8", "ignore"))
    raise ValueError(f"unknown position encoding {encoding!r}")


def units_from_column(body: str, column: int, encoding: str) -> int:
    head = body[:column]
    if encoding == UTF32 or head.isascii():
        return len(head)
    if encoding == UTF16:
        return len(head.encode("utf-16-le", "surrogatepass")) // 2
    if encoding == UTF8:
        return len(head.encode("utf-8"))
    raise ValueError(f"unknown position encoding {encoding!r}")


@dataclass(frozen=True)
class Cursor:
    """A position inside the server: line index and code-point column in that line's body."""

    line: int
    column: int


@dataclass
class Document:
    uri: str
    language_id: str
    version: int
    lines: list[str] = field(default_factory=lambda: [""])
    length: int = 0  # code points in the whole text
    too_large: bool = False  # over MAX_DOCUMENT_CHARS: text dropped, no completions until reopened

    @classmethod
    def create(cls, uri: str, language_id: str, version: int, text: str) -> "Document":
        document = cls(uri, language_id, version)
        document.replace_all(text)
        return document

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def replace_all(self, text: str) -> None:
        if len(text) > MAX_DOCUMENT_CHARS:
            self.lines, self.length, self.too_large = [""], 0, True
            return
        self.lines = split_lines(clean_text(text))
        self.length = len(text)
        self.too_large = False

    def cursor(self, line: int, character: int, encoding: str) -> Cursor:
        """A client position -> Cursor; a line outside the document is an InputError."""
        if not 0 <= line < len(self.lines):
            raise InputError(f"line {line} is outside the document (0..{len(self.lines) - 1})")
        return Cursor(line, column_from_units(line_body(self.lines[line]), character, encoding))

    def clamped_cursor(self, line: int, character: int, encoding: str) -> Cursor:
        """For edit ranges: a line past the end means the end of the document."""
        if line >= len(self.lines):
            last = len(self.lines) - 1
            return Cursor(last, len(line_body(self.lines[last])))
        return self.cursor(max(0, line), character, encoding)

    def position(self, cursor: Cursor, encoding: str) -> tuple[int, int]:
        return cursor.line, units_from_column(line_body(self.lines[cursor.line]), cursor.column, encoding)

    def apply_edit(self, start: Cursor, end: Cursor, new_text: str) -> None:
        """Replace the text between two cursors (swapped if reversed)."""
        if (end.line, end.column) < (start.line, start.column):
            start, end = end, start
        first = max(0, start.line - 1)  # a "\r" before the edit may join a "\n" it inserts
        last = min(len(self.lines) - 1, end.line + 1)  # and a "\r" it inserts may join a "\n" after it
        before = "".join(self.lines[first : start.line]) + self.lines[start.line][: start.column]
        after = self.lines[end.line][end.column :] + "".join(self.lines[end.line + 1 : last + 1])
        removed = sum(map(len, self.lines[start.line : end.line + 1])) - start.column
        removed -= len(self.lines[end.line]) - end.column
        new_text = clean_text(new_text)
        if self.length - removed + len(new_text) > MAX_DOCUMENT_CHARS:
            self.lines, self.length, self.too_large = [""], 0, True
            return
        replacement = split_lines(before + new_text + after)
        if last < len(self.lines) - 1 and replacement[-1] == "":
            replacement.pop()  # the region ended with a terminator: the next line is not part of it
        self.lines[first : last + 1] = replacement
        self.length += len(new_text) - removed

    def change(self, edited: tuple[Any, Any] | None, text: str, encoding: str) -> None:
        """One content change of `didChange`: the text between two LSP positions (`.line`,
        `.character`; a line past the end means the end of the document), or all of it (None).
        A document too large for completions takes only whole replacements."""
        if edited is None:
            self.replace_all(text)
        elif not self.too_large:
            start, end = (self.clamped_cursor(p.line, p.character, encoding) for p in edited)
            self.apply_edit(start, end, text)

    def offset(self, cursor: Cursor) -> int:
        """Code points before the cursor (O(lines before it))."""
        return sum(map(len, self.lines[: cursor.line])) + cursor.column


def runtime_folders(engine_log: Path | None = None) -> set[Path]:
    """The folders kspec writes its logs to (none created here)."""
    folders = {Path(tempfile.gettempdir()) / f"kspec-{os.getuid()}"}
    if base := os.environ.get("XDG_RUNTIME_DIR"):
        folders.add(Path(base) / "kspec")
    if engine_log is not None:
        folders.add(engine_log.parent)
    return {_resolved(folder) for folder in folders}


def is_own_log(uri: str, language_id: str, engine_log: Path | None = None) -> bool:
    if language_id == LOG_LANGUAGE:
        return True
    parsed = urlparse(uri)
    if parsed.scheme != "file" or not parsed.path.endswith(".log"):
        return False
    return _resolved(Path(unquote(parsed.path)).parent) in runtime_folders(engine_log)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


class DocumentStore:
    """Open documents by URI, and the open ones that are kspec's own logs (kept by URI only).
    Plain dicts: the server owns one store per session."""

    def __init__(self) -> None:
        self._documents: dict[str, Document] = {}
        self._own_logs: set[str] = set()

    def open(self, uri: str, language_id: str, version: int, text: str, engine_log: Path | None = None) -> Document | None:
        """The document opened; None when it is one of kspec's own logs (`engine_log`: the engine's log file)."""
        self.close(uri)
        if is_own_log(uri, language_id, engine_log):
            self._own_logs.add(uri)
            return None
        document = Document.create(uri, language_id, version, text)
        self._documents[uri] = document
        return document

    def close(self, uri: str) -> None:
        self._documents.pop(uri, None)
        self._own_logs.discard(uri)

    def get(self, uri: str) -> Document | None:
        """The open document; None for one of kspec's own logs; InputError when `uri` is not open."""
        document = self._documents.get(uri)
        if document is None and uri not in self._own_logs:
            raise InputError(f"document not open: {uri}")
        return document

    def find(self, uri: str) -> Document | None:
        """The open document; None when `uri` is not open or is one of kspec's own logs."""
        return self._documents.get(uri)

    def __contains__(self, uri: str) -> bool:
        return uri in self._documents

    def all(self) -> list[Document]:
        return list(self._documents.values())

    def __len__(self) -> int:
        return len(self._documents)
