"""The context gatherer: for a cursor, the other files' pieces that go before the file's text;
and the session's side of it (`SessionContext`: the workspace folders from `initialize`, the
places the user edits and visits, the budget the settings and the engine's machine fit allow, and
what went in last, told in `$/kspec/status`).

1. the definitions the file imports, resolved inside its workspace folder (imports.py), as
   outlines (outline.py): signatures, class headers with method signatures, constants;
2. chunks (chunks.py: whole definitions, by tree-sitter) of the other open documents of the same
   workspace folder and of recently edited or visited places (`RecentPlaces`), ranked by the Jaccard
   similarity of their identifiers with the lines around the cursor (similarity.py);

within a character budget (`ContextConfig`). The choice is kept per document and replaced only when
it changes meaningfully (an import added or a kept piece gone or changed, or chunks that rank
`refresh_gain` higher): the pieces are the start of the prompt, so keeping them keeps the
engine's prefix cache across keystrokes. Context never comes from outside the cursor's workspace
folder: only open documents and files inside it are read."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp

from kspec.engine.api import CONTEXT_SHARE, MAX_MEMBER_MODULES, MAX_MEMBER_NAMES, ContextFile, ModuleMembers
from kspec.engine.syntax.languages import detect_language
from kspec.lsp_server.crossfile.chunks import Chunk, chunk_at, chunk_text
from kspec.lsp_server.crossfile.imports import Imported, import_key, resolve_imports
from kspec.lsp_server.crossfile.outline import member_names, outline_entries
from kspec.lsp_server.crossfile.similarity import identifiers, jaccard
from kspec.lsp_server.crossfile.workspace import Source, WorkspaceFiles, folder_for, uri_path
from kspec.lsp_server.documents import Document, DocumentStore

MAX_FILE_CHARS = 1 << 20  # an imported file larger than this is not read
MAX_OUTLINES = 256  # modules' outlines kept (by path, version and names)
IMPORT_BASE = 1.0  # an imported module's piece ranks above any chunk (Jaccard <= 1): nearest the file's text
MIN_GAIN = 0.02  # and by at least this much (a kept choice that ranks ~0 is not replaced by another ~0)
IMPORT_NAMED_BONUS = 0.5  # for a module whose name is written around the cursor (`nodes.` in `nodes.Const(...)`)
CHARS_PER_TOKEN = 3.0  # code averages 3-4 characters per BPE token: the budget is converted with the lower figure


@dataclass(frozen=True)
class ContextConfig:
    """The gatherer's validated configuration and its token budget."""

    enabled: bool = True
    max_tokens: int = 1024  # the user's cap (setting `contextTokens`)
    query_lines_before: int = 40  # the lines around the cursor chunks are ranked against
    query_lines_after: int = 10
    max_chunks: int = 6
    min_similarity: float = 0.04  # a chunk sharing less with the cursor's lines is left out
    import_share: float = 0.6  # of the budget at most, for imported definitions
    refresh_gain: float = 0.3  # a new choice of chunks replaces the kept one when it ranks this much higher
    ring_size: int = 16

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0.0 < self.import_share <= 1.0 or self.refresh_gain < 0 or self.max_chunks < 0 or self.ring_size < 1:
            raise ValueError("import_share in (0, 1], refresh_gain >= 0, max_chunks >= 0, ring_size >= 1")

    def budget_chars(self, prompt_tokens: float | None) -> int:
        """Characters of context: the user's cap, and at most the engine's `CONTEXT_SHARE` of what the
        machine prefills cold in its budget (`prompt_tokens`, the engine's machine fit; None: not known)."""
        tokens = self.max_tokens if prompt_tokens is None else min(self.max_tokens, int(prompt_tokens * CONTEXT_SHARE))
        return int(tokens * CHARS_PER_TOKEN) if self.enabled else 0


@dataclass(frozen=True)
class Candidate:
    key: tuple[str, str, int]  # (kind, uri or path, first line): what a kept choice is checked against
    piece: ContextFile
    score: float  # chunks: similarity with the cursor's lines; imports: 1.0


@dataclass(frozen=True)
class Entry:
    text: str  # an outline entry: a definition's signature, a class with its members' signatures
    words: frozenset[str]  # its identifiers


@dataclass(frozen=True)
class Gathered:
    pieces: tuple[ContextFile, ...] = ()
    members: tuple[ModuleMembers, ...] = ()  # the names of the modules the file reaches by a qualifier (`nodes.`)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(piece.path for piece in self.pieces))

    @property
    def chars(self) -> int:
        return sum(len(piece.text) for piece in self.pieces)


@dataclass(frozen=True)
class Place:
    uri: str
    line: int


class RecentPlaces:
    """Recently edited and visited places, a ring buffer as llama.vim keeps (its chunks of recently
    opened, edited and yanked text): each place is a document and a line; the chunk holding it is
    looked up when context is gathered, so a place follows its document's later edits."""

    def __init__(self, size: int = 16) -> None:
        self._places: deque[Place] = deque(maxlen=size)

    def note(self, uri: str, line: int, near: int = 8) -> None:
        """A place edited or visited; one within `near` lines of a remembered one replaces it."""
        for place in list(self._places):
            if place.uri == uri and abs(place.line - line) <= near:
                self._places.remove(place)
        self._places.append(Place(uri, line))

    def forget(self, uri: str) -> None:
        for place in [p for p in self._places if p.uri == uri]:
            self._places.remove(place)

    def of(self, uri: str) -> list[int]:
        """The lines noted in `uri`, most recent last."""
        return [p.line for p in self._places if p.uri == uri]

    def uris(self) -> list[str]:
        return list(dict.fromkeys(p.uri for p in self._places))


class ContextGatherer:
    """One per client: its recent places, each document's chunks (by version) and kept choice."""

    def __init__(self, config: ContextConfig = ContextConfig()) -> None:
        self.config = config
        self.places = RecentPlaces(config.ring_size)
        self._chunks: dict[tuple[str, int], list[Chunk]] = {}
        self._words: dict[tuple[str, int], list[frozenset[str]]] = {}  # the identifiers of each cached chunk
        self._outlines: dict[tuple[str, int, frozenset[str] | None], list[Entry]] = {}
        self._names: dict[tuple[str, int], tuple[str, ...]] = {}  # (module path, version) -> its member names
        self._resolved: dict[str, tuple[tuple[Any, ...], list[Imported]]] = {}  # uri -> (its import lines, their files)
        self._kept: dict[str, tuple[tuple[Any, ...], list[Candidate]]] = {}  # uri -> (its imports' signature, the choice)

    def forget(self, uri: str) -> None:
        self.places.forget(uri)
        self._kept.pop(uri, None)
        self._resolved.pop(uri, None)
        self._chunks = {key: value for key, value in self._chunks.items() if key[0] != uri}
        self._words = {key: value for key, value in self._words.items() if key[0] != uri}

    def gather(self, current: Source, line: int, workspace: WorkspaceFiles, budget_chars: int) -> Gathered:
        """The pieces for a cursor at `line` of `current`; `workspace` holds the open documents
        and files of `current`'s workspace folder only."""
        if budget_chars <= 0 or not self.config.enabled:
            return Gathered()
        query = identifiers(_around(current.text, line, self.config.query_lines_before, self.config.query_lines_after))
        modules, members = self._imported(current, workspace)
        signature = tuple((m[0], m[1]) for m in modules)
        imports = self._imports(modules, query, int(budget_chars * self.config.import_share))
        room = budget_chars - sum(len(c.piece.text) for c in imports)
        chunks = self._fit(self._ranked_chunks(current, workspace, query), room)[: self.config.max_chunks]
        chosen = self._stable(current.uri, signature, imports + chunks, workspace, query)
        pieces = tuple(c.piece for c in sorted(chosen, key=lambda c: c.score))  # most relevant last: nearest the file's text
        return Gathered(pieces, members)

    # --- the kept choice ---------------------------------------------------------------

    def _stable(
        self, uri: str, signature: tuple[Any, ...], chosen: list[Candidate], workspace: WorkspaceFiles, query: frozenset[str]
    ) -> list[Candidate]:  # fmt: skip
        """The kept choice while the imports are the same, its chunks are still there, and the new
        choice does not rank `refresh_gain` higher than the kept one does now."""
        kept = self._kept.get(uri)
        if kept is not None and kept[0] == signature and self._still_there([c for c in kept[1] if c.key[0] == "chunk"], workspace):
            better = False
            for kind in ("import", "chunk"):  # each part on its own: a better chunk is not drowned by the imports' merit
                old = sum(_rescored(c, query) for c in kept[1] if c.key[0] == kind)
                new = sum(_merit(c) for c in chosen if c.key[0] == kind)
                better = better or new > old * (1.0 + self.config.refresh_gain) + MIN_GAIN
            if not better:
                return kept[1]
        self._kept[uri] = (signature, chosen)
        return chosen

    def _still_there(self, chunks: list[Candidate], workspace: WorkspaceFiles) -> bool:
        """Every kept chunk is still a chunk of its document (open, and unchanged there)."""
        for candidate in chunks:
            source = workspace.open_source(candidate.key[1])
            if source is None or all(c.text != candidate.piece.text for c in self._chunks_of(source)):
                return False
        return True

    # --- candidates ----------------------------------------------------------------------

    def _imported(self, current: Source, workspace: WorkspaceFiles) -> tuple[list[tuple[str, int, list[Entry]]], tuple[ModuleMembers, ...]]:
        """(path in the folder, its version, outline entries) of each module the file imports, and
        the member names of those it reaches by a qualifier (`nodes` in `nodes.Const`)."""
        language = detect_language(current.language_id, current.path or "")
        if current.path is None or language is None:
            return [], ()
        found: list[tuple[str, int, list[Entry]]] = []
        members: list[ModuleMembers] = []
        key = (str(workspace.folder), import_key(current.text, language))
        cached = self._resolved.get(current.uri)
        if cached is None or cached[0] != key:
            cached = self._resolved[current.uri] = (key, resolve_imports(current.text, language, current.path, workspace.folder))
        outlined: set[tuple[Path, frozenset[str] | None]] = set()
        for imported in cached[1]:
            source = workspace.source_of(imported.path, MAX_FILE_CHARS)
            module_language = detect_language("", str(imported.path))
            if source is None or module_language is None:
                continue
            if imported.qualifier and len(members) < MAX_MEMBER_MODULES:
                names = self._member_names(imported.path, source, module_language)
                room = MAX_MEMBER_NAMES - sum(len(m.names) for m in members)
                if names and room > 0:
                    members.append(ModuleMembers(imported.qualifier, names[:room]))
            if (imported.path, imported.names) in outlined:
                continue  # one module imported under two names: one outline
            outlined.add((imported.path, imported.names))
            key = (str(imported.path), source.version, imported.names)
            if key not in self._outlines:
                if len(self._outlines) > MAX_OUTLINES:
                    self._outlines.clear()
                entries = outline_entries(source.text, module_language, imported.names)
                self._outlines[key] = [Entry(text, identifiers(text)) for text in entries]
            if self._outlines[key]:
                found.append((workspace.relative(imported.path), source.version, self._outlines[key]))
        return found, tuple(members)

    def _member_names(self, path: Path, source: Source, language: str) -> tuple[str, ...]:
        key = (str(path), source.version)
        if key not in self._names:
            if len(self._names) > MAX_OUTLINES:
                self._names.clear()
            self._names[key] = member_names(source.text, language, package=path.name == "__init__.py")
        return self._names[key]

    @staticmethod
    def _imports(modules: list[tuple[str, int, list[Entry]]], query: frozenset[str], budget_chars: int) -> list[Candidate]:
        """One piece per imported module: its outline entries that rank highest against the
        cursor's lines (a module named there first), within the budget, in file order."""
        ranked = []
        for path, _version, entries in modules:
            stem = Path(path).stem if Path(path).stem != "__init__" else Path(path).parent.name
            named = IMPORT_NAMED_BONUS if stem in query else 0.0
            ranked += [(jaccard(entry.words | {stem}, query) + named, path, at) for at, entry in enumerate(entries)]
        ranked.sort(key=lambda r: -r[0])
        chosen: dict[str, list[tuple[int, float]]] = {}
        used = 0
        for score, path, at in ranked:
            entry = next(m[2][at].text for m in modules if m[0] == path)
            if used + len(entry) + len(path) <= budget_chars:
                chosen.setdefault(path, []).append((at, score))
                used += len(entry) + 1
        pieces = []
        for path, picked in chosen.items():
            entries = next(m[2] for m in modules if m[0] == path)
            text = "".join(entries[at].text + "\n" for at, _ in sorted(picked))
            pieces.append(Candidate(("import", path, 0), ContextFile(path, text), IMPORT_BASE + max(s for _, s in picked)))
        return pieces

    def _chunks_of(self, source: Source) -> list[Chunk]:
        key = (source.uri, source.version)
        if key not in self._chunks:
            self._chunks = {k: v for k, v in self._chunks.items() if k[0] != source.uri}
            self._chunks[key] = chunk_text(source.text, detect_language(source.language_id, source.uri))
            self._words = {k: v for k, v in self._words.items() if k[0] != source.uri}
            self._words[key] = [identifiers(chunk.text) for chunk in self._chunks[key]]
        return self._chunks[key]

    def _ranked_chunks(self, current: Source, workspace: WorkspaceFiles, query: frozenset[str]) -> list[Candidate]:
        found: dict[tuple[str, str, int], Candidate] = {}
        for source in workspace.open_sources():
            if source.uri == current.uri:
                continue
            path = workspace.relative_uri(source.uri)
            chunks = self._chunks_of(source)
            noted = {id(c) for c in (chunk_at(chunks, line) for line in self.places.of(source.uri)) if c is not None}
            for chunk, words in zip(chunks, self._words[(source.uri, source.version)]):
                score = jaccard(words, query)
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


def _merit(candidate: Candidate) -> float:
    """What a piece's score says of its fit with the cursor's lines (an import's rank base left out)."""
    return candidate.score - IMPORT_BASE if candidate.key[0] == "import" else candidate.score


def _rescored(candidate: Candidate, query: frozenset[str]) -> float:
    """A kept piece's merit against the cursor's lines now (an import's: as when it was chosen)."""
    if candidate.key[0] == "import":
        return _merit(candidate)
    return jaccard(identifiers(candidate.piece.text), query)


def workspace_folders(params: lsp.InitializeParams) -> tuple[Path, ...]:
    """The client's workspace folders (else its root), as resolved paths."""
    uris = [folder.uri for folder in params.workspace_folders or ()] or ([params.root_uri] if params.root_uri else [])
    paths = [uri_path(uri) for uri in uris]
    if not paths and params.root_path:
        paths = [Path(params.root_path)]
    return tuple(p.resolve() for p in paths if p is not None)


def _source(document: Document) -> Source:
    return Source(document.uri, document.language_id, document.version, lambda: document.text)


class SessionContext:
    """One per client: its folders, its gatherer (recent places, kept choices) and what went in last."""

    def __init__(self) -> None:
        self.folders: tuple[Path, ...] = ()
        self.gatherer = ContextGatherer()
        self.last: dict[str, Any] = {"files": [], "chars": 0, "modules": [], "document": None}  # the last query's (the engine's answer adds `tokens`)

    def set_folders(self, params: lsp.InitializeParams) -> None:
        self.folders = workspace_folders(params)

    def note(self, uri: str, line: int) -> None:
        """A place edited or visited (the ring buffer of recent places)."""
        self.gatherer.places.note(uri, line)

    def forget(self, uri: str) -> None:
        self.gatherer.forget(uri)

    def gather(self, documents: DocumentStore, document: Document, line: int, on: bool, cap: int, prompt_tokens: float | None) -> Gathered:
        """The pieces (and imported modules' member names) for a cursor at `line` of `document`:
        only from its workspace folder."""
        config = ContextConfig(enabled=on, max_tokens=cap)
        if self.gatherer.config != config:
            self.gatherer.config = config
        current = _source(document)
        self.note(document.uri, line)  # a visited place: its chunk weighs more once the user is in another file
        folder = folder_for(current.path.resolve() if current.path else None, self.folders)
        if folder is None or not on:
            self.last = {"files": [], "chars": 0, "modules": [], "document": document.uri}
            return Gathered()
        workspace = WorkspaceFiles(folder, [_source(d) for d in documents.all()], self.folders)
        gathered = self.gatherer.gather(current, line, workspace, config.budget_chars(prompt_tokens))
        self.last = {"files": list(gathered.files), "chars": gathered.chars, "modules": [m.qualifier for m in gathered.members], "document": document.uri}
        return gathered
