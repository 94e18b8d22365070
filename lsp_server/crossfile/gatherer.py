"""The context gatherer: for a cursor, the other files' pieces that go before the file's text.

1. the definitions the file imports, resolved inside its workspace folder (imports.py), as
   outlines (outline.py): signatures, class headers with method signatures, constants;
2. chunks (chunks.py: whole definitions, by tree-sitter) of the other open documents of the same
   workspace folder and of recently edited or visited places (places.py), ranked by the Jaccard
   similarity of their identifiers with the lines around the cursor (similarity.py);

within a character budget (config.py). The choice is kept per document and replaced only when
it changes meaningfully (an import added or a kept piece gone or changed, or chunks that rank
`refresh_gain` higher): the pieces are the start of the prompt, so keeping them keeps the
engine's prefix cache across keystrokes. Context never comes from outside the cursor's workspace
folder: only open documents and files inside it are read."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kspec.engine.api import ContextFile
from kspec.engine.syntax.languages import detect_language
from kspec.lsp_server.crossfile.chunks import Chunk, chunk_at, chunk_text
from kspec.lsp_server.crossfile.config import ContextConfig
from kspec.lsp_server.crossfile.imports import Imported, resolve_imports
from kspec.lsp_server.crossfile.outline import outline
from kspec.lsp_server.crossfile.places import RecentPlaces
from kspec.lsp_server.crossfile.similarity import identifiers, jaccard
from kspec.lsp_server.crossfile.workspace import Source, WorkspaceFiles

MAX_FILE_CHARS = 1 << 20  # an imported file larger than this is not read


@dataclass(frozen=True)
class Candidate:
    key: tuple[str, str, int]  # (kind, uri or path, first line): what a kept choice is checked against
    piece: ContextFile
    score: float  # chunks: similarity with the cursor's lines; imports: 1.0


@dataclass(frozen=True)
class Gathered:
    pieces: tuple[ContextFile, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(piece.path for piece in self.pieces))

    @property
    def chars(self) -> int:
        return sum(len(piece.text) for piece in self.pieces)


class ContextGatherer:
    """One per client: its recent places, each document's chunks (by version) and kept choice."""

    def __init__(self, config: ContextConfig = ContextConfig()) -> None:
        self.config = config
        self.places = RecentPlaces(config.ring_size)
        self._chunks: dict[tuple[str, int], list[Chunk]] = {}
        self._outlines: dict[tuple[str, int, frozenset[str] | None], str] = {}
        self._kept: dict[str, tuple[list[Candidate], list[Candidate]]] = {}  # uri -> (imports, chunks)

    def forget(self, uri: str) -> None:
        self.places.forget(uri)
        self._kept.pop(uri, None)
        self._chunks = {key: value for key, value in self._chunks.items() if key[0] != uri}

    def gather(self, current: Source, line: int, workspace: WorkspaceFiles, budget_chars: int) -> Gathered:
        """The pieces for a cursor at `line` of `current`; `workspace` holds the open documents
        and files of `current`'s workspace folder only."""
        if budget_chars <= 0 or not self.config.enabled:
            return Gathered()
        imports = self._fit(self._imports(current, workspace), int(budget_chars * self.config.import_share))
        room = budget_chars - sum(len(c.piece.text) for c in imports)
        query = identifiers(_around(current.text, line, self.config.query_lines_before, self.config.query_lines_after))
        chunks = self._fit(self._ranked_chunks(current, workspace, query), room)[: self.config.max_chunks]
        imports, chunks = self._stable(current.uri, imports, chunks, workspace, query)
        ordered = sorted(chunks, key=lambda c: c.score) + imports  # most relevant last: nearest the file's text
        return Gathered(tuple(c.piece for c in ordered))

    # --- the kept choice ---------------------------------------------------------------

    def _stable(
        self, uri: str, imports: list[Candidate], chunks: list[Candidate], workspace: WorkspaceFiles, query: frozenset[str]
    ) -> tuple[list[Candidate], list[Candidate]]:  # fmt: skip
        kept = self._kept.get(uri)
        if kept is not None and kept[0] == imports and self._still_there(kept[1], workspace):
            old = sum(jaccard(identifiers(c.piece.text), query) for c in kept[1])
            new = sum(c.score for c in chunks)
            if new <= old * (1.0 + self.config.refresh_gain) + 1e-9:
                return kept
        self._kept[uri] = (imports, chunks)
        return imports, chunks

    def _still_there(self, chunks: list[Candidate], workspace: WorkspaceFiles) -> bool:
        """Every kept chunk is still a chunk of its document (open, and unchanged there)."""
        for candidate in chunks:
            source = workspace.open_source(candidate.key[1])
            if source is None or all(c.text != candidate.piece.text for c in self._chunks_of(source)):
                return False
        return True

    # --- candidates ----------------------------------------------------------------------

    def _imports(self, current: Source, workspace: WorkspaceFiles) -> list[Candidate]:
        language = detect_language(current.language_id, current.path)
        if current.path is None or language is None:
            return []
        found = []
        for imported in resolve_imports(current.text, language, current.path, workspace.folder):
            text = self._outline(imported, workspace)
            if text.strip():
                path = workspace.relative(imported.path)
                found.append(Candidate(("import", path, 0), ContextFile(path, text), 1.0))
        return found

    def _outline(self, imported: Imported, workspace: WorkspaceFiles) -> str:
        source = workspace.source_of(imported.path, MAX_FILE_CHARS)
        language = detect_language("", str(imported.path))
        if source is None or language is None:
            return ""
        key = (str(imported.path), source.version, imported.names)
        if key not in self._outlines:
            if len(self._outlines) > 256:
                self._outlines.clear()
            self._outlines[key] = outline(source.text, language, imported.names)
        return self._outlines[key]

    def _chunks_of(self, source: Source) -> list[Chunk]:
        key = (source.uri, source.version)
        if key not in self._chunks:
            self._chunks = {k: v for k, v in self._chunks.items() if k[0] != source.uri}
            self._chunks[key] = chunk_text(source.text, detect_language(source.language_id, source.uri))
        return self._chunks[key]

    def _ranked_chunks(self, current: Source, workspace: WorkspaceFiles, query: frozenset[str]) -> list[Candidate]:
        found: dict[tuple[str, str, int], Candidate] = {}
        for source in workspace.open_sources():
            if source.uri == current.uri:
                continue
            path = workspace.relative_uri(source.uri)
            chunks = self._chunks_of(source)
            noted = {id(c) for c in (chunk_at(chunks, line) for line in self.places.of(source.uri)) if c is not None}
            for chunk in chunks:
                score = jaccard(identifiers(chunk.text), query)
                if id(chunk) in noted:
                    score *= 1.25  # an edited or visited place weighs a little more
                if score >= self.config.min_similarity:
                    key = ("chunk", source.uri, chunk.start)
                    found[key] = Candidate(key, ContextFile(path, chunk.text), score)
        return sorted(found.values(), key=lambda c: -c.score)

    @staticmethod
    def _fit(candidates: Iterable[Candidate], budget_chars: int) -> list[Candidate]:
        kept, used = [], 0
        for candidate in candidates:
            if used + len(candidate.piece.text) <= budget_chars:
                kept.append(candidate)
                used += len(candidate.piece.text)
        return kept


def _around(text: str, line: int, before: int, after: int) -> str:
    lines = text.splitlines()
    return "\n".join(lines[max(0, line - before) : line + after + 1])
