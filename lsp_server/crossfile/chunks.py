"""A document cut into chunks at tree-sitter boundaries: each top-level definition (function,
class, and their decorated forms; Go/Rust/Java/JS declarations) is one chunk, and the runs of
other top-level statements between them are chunks too. A definition longer than `max_lines`
keeps its first lines (its header and the start of its body). Unknown languages are cut into
blank-line-separated paragraphs."""

from __future__ import annotations

from dataclasses import dataclass

from kspec.engine.syntax.languages import new_parser

MAX_LINES = 60
DEFINITION_KINDS = frozenset({
    "function_definition", "class_definition", "decorated_definition",  # Python
    "function_declaration", "class_declaration", "lexical_declaration", "export_statement",  # JS/TS
    "interface_declaration", "type_alias_declaration", "method_declaration", "type_declaration",  # TS, Go
    "function_item", "struct_item", "impl_item", "enum_item", "trait_item",  # Rust
    "enum_declaration", "record_declaration",  # Java
})  # fmt: skip


@dataclass(frozen=True)
class Chunk:
    start: int  # first line (0-based)
    end: int  # one past its last line
    text: str


def _cut(lines: list[str], start: int, end: int, max_lines: int) -> Chunk:
    end = min(end, start + max_lines)
    return Chunk(start, end, "".join(lines[start:end]))


def _paragraphs(lines: list[str], max_lines: int) -> list[Chunk]:
    chunks, start = [], 0
    for at, line in enumerate([*lines, ""]):
        if not line.strip():
            if at > start:
                chunks.append(_cut(lines, start, at, max_lines))
            start = at + 1
    return chunks


def _top_level(text: str, language: str) -> list[tuple[int, int, bool]]:
    """(first line, end line, is a definition) of each top-level node."""
    tree = new_parser(language).parse(text.encode("utf-8"))
    nodes = []
    for node in tree.root_node.children:
        body = node.children[-1] if node.type == "export_statement" and node.children else node
        nodes.append((node.start_point[0], node.end_point[0] + 1, node.type in DEFINITION_KINDS or body.type in DEFINITION_KINDS))
    return nodes


def chunk_text(text: str, language: str | None, max_lines: int = MAX_LINES) -> list[Chunk]:
    """The chunks of a document's text, in order."""
    lines = text.splitlines(keepends=True)
    if language is None:
        return _paragraphs(lines, max_lines)
    chunks: list[Chunk] = []
    run: tuple[int, int] | None = None  # top-level statements between definitions, merged
    for start, end, definition in _top_level(text, language):
        if definition:
            if run is not None:
                chunks.append(_cut(lines, *run, max_lines))
                run = None
            chunks.append(_cut(lines, start, end, max_lines))
        else:
            run = (run[0] if run else start, end)
    if run is not None:
        chunks.append(_cut(lines, *run, max_lines))
    return [chunk for chunk in chunks if chunk.text.strip()]


def chunk_at(chunks: list[Chunk], line: int) -> Chunk | None:
    """The chunk holding `line`, or the nearest one before it."""
    found = None
    for chunk in chunks:
        if chunk.start <= line:
            found = chunk
        if chunk.start <= line < chunk.end:
            return chunk
    return found
