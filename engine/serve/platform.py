"""What only a Unix system offers, imported where it is used: the shared daemon (a Unix
socket, file locks) needs it; `kspec lsp` with an in-process, remote or OpenAI-compatible
engine does not, so the language server starts on Windows too."""

from __future__ import annotations

import importlib
from types import ModuleType

from kspec.engine.errors import EngineUnavailable

NEEDS_UNIX = "the shared engine daemon needs a Unix system; on this one set the engine to 'inprocess', 'remote' or 'openai'"


def unix_only(name: str) -> ModuleType:
    """The Unix-only module `name` (fcntl, ...), or EngineUnavailable saying what to use instead."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise EngineUnavailable(f"{NEEDS_UNIX} (no {name} module here)") from None
