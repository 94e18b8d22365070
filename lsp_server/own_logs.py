"""kspec's own log files are never completion context: "kspec: Show log" opens the engine
daemon's log in an editor tab, and the editor tells the server about it like any document.

A document is one of kspec's logs when its language is `log` (VS Code's language for `*.log`
files), or it is a `.log` file in kspec's runtime folder (runtime.py: `$XDG_RUNTIME_DIR/kspec`,
else `kspec-$UID` in the temp folder) or in the folder of the engine's own log file (a folder
the settings chose). Such a document is not kept: it gets no completions and is not another
file's context.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

LOG_LANGUAGE = "log"


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


class OwnLogs:
    """The open documents that are kspec's own logs (by URI)."""

    def __init__(self) -> None:
        self._uris: set[str] = set()

    def opened(self, uri: str, language_id: str, engine_log: Path | None) -> bool:
        """Whether the document opened is one of them (then it is remembered as such)."""
        if is_own_log(uri, language_id, engine_log):
            self._uris.add(uri)
            return True
        self._uris.discard(uri)
        return False

    def closed(self, uri: str) -> None:
        self._uris.discard(uri)

    def __contains__(self, uri: object) -> bool:
        return uri in self._uris
