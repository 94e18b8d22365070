"""The session's side of the context gatherer (crossfile/): its workspace folders (from
`initialize`), the places the user edits and visits, and, for a query, the other files' pieces
of the cursor's workspace folder under the budget the settings and the engine's machine fit
allow. What went in last is told in `$/kspec/status` (`context`: the document asked for, files, characters and the
tokens the engine used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lsprotocol import types as lsp

from kspec.lsp_server.crossfile.config import ContextConfig
from kspec.lsp_server.crossfile.gatherer import ContextGatherer, Gathered
from kspec.lsp_server.crossfile.workspace import Source, WorkspaceFiles, folder_for, uri_path
from kspec.lsp_server.documents import Document, DocumentStore


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
