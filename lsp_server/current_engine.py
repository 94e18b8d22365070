"""A session's engine: the one its settings call for, replaced when they call for another.

Only the current engine's statuses reach the session: each engine is made with its generation,
and a status of a replaced one (its model, "ready") is dropped. A replaced engine is closed at
once and kept until its thread has finished, so that the session can wait for it at exit.
In-process engines share one `LoadSlot`: a storm of model changes loads the last."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.status import Status
from kspec.lsp_server.engine_client import EngineClient
from kspec.lsp_server.engine_placement import make_engine
from kspec.lsp_server.options import ServerOptions
from kspec.lsp_server.settings import Settings


class CurrentEngine:
    def __init__(self, options: ServerOptions, on_status: Callable[[Status], None]) -> None:
        self.options = options
        self.engine: EngineClient | None = None
        self._on_status = on_status
        self._retired: list[EngineClient] = []  # closed engines whose thread may still be finishing
        self._key: tuple[Any, ...] | None = None
        self._load_slot = LoadSlot()  # one in-process engine loads (or lives) at a time
        self._generation = 0  # of self.engine: statuses of the engines it replaced are dropped

    def fits(self, settings: Settings) -> bool:
        """Whether the current engine is the one `settings` call for."""
        return self.engine is not None and settings.engine_key() == self._key

    def retire(self) -> bool:
        """Close the current engine (it finishes in the background); False when there was none."""
        if self.engine is None:
            return False
        self.engine.close()
        self._retired = [e for e in self._retired if not e.join(0)] + [self.engine]
        self.engine = None
        return True

    def make(self, settings: Settings, tell: Callable[[str], None]) -> EngineClient:
        """The engine `settings` call for, now the current one (not started yet; `tell`: an
        informational message for the user)."""
        self._key = settings.engine_key()
        self._generation += 1
        self.engine = make_engine(settings, self.options, partial(self._status_from, self._generation), self._load_slot, tell)
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def engines(self) -> list[EngineClient]:
        """The retired engines and the current one."""
        return self._retired + ([self.engine] if self.engine else [])

    def running_threads(self) -> int:
        return sum(not engine.join(0) for engine in self.engines())

    def _status_from(self, generation: int, status: Status) -> None:
        """A status of the engine of `generation`: dropped once that engine was replaced."""
        if generation == self._generation:
            self._on_status(status)
