"""Model loading as standard LSP work-done progress (`window/workDoneProgress/create`, then
`$/progress` begin / report / end), which VS Code's status bar and Neovim UIs such as
fidget.nvim show without a plugin. `$/kspec/status` keeps carrying the engine's state;
this only mirrors its loading phase, for clients that offer `window.workDoneProgress`."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from lsprotocol import types as lsp

from kspec.engine.serve.status import LOADING, Status

TITLE = "kspec: loading the model"


class WorkDoneProgress(Protocol):  # pygls.progress.Progress
    tokens: dict[Any, Any]

    def create(self, token: str, callback: Any = None) -> Any: ...
    def begin(self, token: str, value: lsp.WorkDoneProgressBegin) -> None: ...
    def report(self, token: str, value: lsp.WorkDoneProgressReport) -> None: ...
    def end(self, token: str, value: lsp.WorkDoneProgressEnd) -> None: ...


def client_shows_progress(capabilities: lsp.ClientCapabilities) -> bool:
    return bool(capabilities.window and capabilities.window.work_done_progress)


def _percentage(status: Status) -> int | None:
    return None if status.progress is None else max(0, min(100, round(status.progress * 100)))


class LoadingProgress:
    """One progress per loading phase: begun once the client created the token, reported
    while the status says loading, ended when it says anything else."""

    def __init__(self, progress: WorkDoneProgress, enabled: bool) -> None:
        self._progress = progress
        self._enabled = enabled
        self._token: str | None = None
        self._begun = False  # the client answered the create request and we sent "begin"
        self._latest: Status | None = None  # the status to begin with, or to end with
        self._ended = False  # loading ended before the client answered the create request

    def update(self, status: Status) -> None:
        if not self._enabled:
            return
        self._latest = status
        if status.state == LOADING:
            if self._token is None:
                self._token, self._begun, self._ended = f"kspec-loading-{uuid.uuid4().hex}", False, False
                token = self._token
                self._progress.create(token, callback=lambda *_: self._created(token))
            elif self._begun:
                self._progress.report(self._token, lsp.WorkDoneProgressReport(message=status.message, percentage=_percentage(status)))
        elif self._token is not None:
            if self._begun:
                self._end(self._token, status)
            else:
                self._ended = True  # ended once the client has answered

    def _created(self, token: str) -> None:
        if token != self._token or self._latest is None:
            return
        status = self._latest
        self._progress.begin(token, lsp.WorkDoneProgressBegin(title=TITLE, message=status.message, percentage=_percentage(status), cancellable=False))
        self._begun = True
        if self._ended or status.state != LOADING:
            self._end(token, status)

    def _end(self, token: str, status: Status) -> None:
        self._progress.end(token, lsp.WorkDoneProgressEnd(message=status.message or status.state))
        self._progress.tokens.pop(token, None)
        self._token, self._begun, self._ended = None, False, False
