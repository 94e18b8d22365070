"""Messages for the user (`window/showMessage`): each shown once until the engine is ready again,
so a failing engine or a setting that cannot work does not repeat itself at every keystroke."""

from __future__ import annotations

import logging
from typing import Callable

from lsprotocol import types as lsp

log = logging.getLogger("kspec.lsp")


class Messages:
    def __init__(self, send: Callable[[lsp.ShowMessageParams], None]) -> None:
        self._send = send
        self._shown: set[str] = set()

    def show(self, message: str, kind: lsp.MessageType) -> None:
        if message in self._shown:
            return
        self._shown.add(message)
        log.warning("%s", message)
        self._send(lsp.ShowMessageParams(type=kind, message=message))

    def forget(self) -> None:
        """The engine is ready (or replaced): a message may be shown again."""
        self._shown.clear()
