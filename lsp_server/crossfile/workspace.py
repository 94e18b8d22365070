"""What the gatherer may read for a cursor: the open documents and the files of the cursor's
workspace folder, and nothing else (the boundary that keeps context from leaking between
workspace folders or clients)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from urllib.parse import unquote, urlparse


def uri_path(uri: str) -> Path | None:
    """The file path of a `file:` URI; None for other schemes (untitled buffers)."""
    parsed = urlparse(uri)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else None


class Source:
    """A document's text, read lazily (joining a large document's lines costs; its chunks are
    cached by version, so it is read once per version)."""

    def __init__(self, uri: str, language_id: str, version: int, text: Callable[[], str]) -> None:
        self.uri, self.language_id, self.version = uri, language_id, version
        self.path = uri_path(uri)
        self._read = text

    @cached_property
    def text(self) -> str:
        return self._read()


def folder_for(path: Path | None, folders: Iterable[Path]) -> Path | None:
    """The deepest workspace folder holding `path`; else `path`'s own folder; None without a path."""
    if path is None:
        return None
    holding = [f for f in folders if path.is_relative_to(f)]
    return max(holding, key=lambda f: len(f.parts)) if holding else path.parent


class WorkspaceFiles:
    def __init__(self, folder: Path, documents: Iterable[Source], folders: Iterable[Path] = ()) -> None:
        """`documents`: all the client's open documents; those outside `folder`, or inside a deeper
        workspace folder nested in it, are left out."""
        self.folder = folder.resolve()
        nested = [f.resolve() for f in folders if f.resolve() != self.folder and f.resolve().is_relative_to(self.folder)]
        # documents' paths are normalised, not resolved (a resolve is a syscall per component, on every keystroke)
        self._open = {
            d.uri: d for d in documents
            if d.path is not None and _under(d.path, self.folder) and not any(_under(d.path, n) for n in nested)
        }  # fmt: skip
        self._by_path = {os.path.normpath(d.path): d for d in self._open.values() if d.path is not None}

    def open_sources(self) -> list[Source]:
        return list(self._open.values())

    def open_source(self, uri: str) -> Source | None:
        return self._open.get(uri)

    def source_of(self, path: Path, max_chars: int) -> Source | None:
        """An open document's text, else the file's (inside the folder only; `path` resolved)."""
        resolved = path
        if not _under(resolved, self.folder):
            return None
        if (document := self._by_path.get(os.path.normpath(resolved))) is not None:
            return document
        try:
            stat = resolved.stat()
        except OSError:
            return None
        if stat.st_size > max_chars:
            return None
        return Source(resolved.as_uri(), "", stat.st_mtime_ns, lambda: _read(resolved))  # read only when its outline is not cached

    def relative(self, path: Path) -> str:
        return os.path.relpath(path, self.folder)

    def relative_uri(self, uri: str) -> str:
        path = uri_path(uri)
        return self.relative(path) if path is not None else uri


def _under(path: Path, folder: Path) -> bool:
    """`path` (absolute) is `folder` or inside it, by its normalised spelling."""
    spelled = os.path.normpath(path)
    return spelled == str(folder) or spelled.startswith(str(folder).rstrip(os.sep) + os.sep)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
