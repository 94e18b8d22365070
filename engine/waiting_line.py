"""The one queue a request waits in inside the engine, from its arrival to its place in the batch
(engine/batching.py): the runner's event loop puts requests in (engine/serve/runner.py), the
batch's thread takes them at each round and waits on the line when it has nothing to run.
Torch-free: the language server imports the runner without the model's libraries."""

from __future__ import annotations

import threading
from collections import deque
from typing import NamedTuple

from kspec.engine.api import CancelToken, CompletionRequest, Done, EarlyAnswer


class Waiting(NamedTuple):
    """A request that has not joined the batch yet."""

    request: CompletionRequest
    cancel: CancelToken
    done: Done
    early: EarlyAnswer | None
    arrived: float  # time.monotonic() when it reached the engine


class WaitingLine:
    """The one queue a request waits in between its arrival and its place in the batch, in
    arrival order. Any thread may `put` (the runner's event loop does); the batch's thread takes
    (`take`), and waits on it when it has nothing to run (`wait`). `close` refuses what comes later."""

    def __init__(self) -> None:
        self._entries: deque[Waiting] = deque()
        self._changed = threading.Condition()
        self.closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, waiting: Waiting) -> bool:
        """False once closed (nothing is queued then)."""
        with self._changed:
            if self.closed:
                return False
            self._entries.append(waiting)
            self._changed.notify()
            return True

    def take(self) -> Waiting | None:
        """The longest waiting, None when none waits."""
        with self._changed:
            return self._entries.popleft() if self._entries else None

    def cancel_all(self) -> None:
        with self._changed:
            for waiting in self._entries:
                waiting.cancel.cancel()

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until a request waits or the line is closed (True), or `timeout_s` passed (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: bool(self._entries) or self.closed, timeout_s)
