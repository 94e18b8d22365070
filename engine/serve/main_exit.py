"""Workers told to stop when the main thread ends, before the interpreter waits for them.

At exit the interpreter first joins every non-daemon thread and only then runs `atexit`'s
functions, so a worker that waits for work on a non-daemon thread (engine/serve/runner.py: a
daemon thread would be ended inside torch's native code at finalization, which aborts the
process) would keep the process alive for good if only an `atexit` function told it to stop.
Here one daemon thread joins the main thread and then calls `stop()` on every registered worker
still alive (held weakly): each finishes its current work and returns, and the interpreter's
join of its thread ends. The registry is process-wide, as the interpreter's exit is."""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> None:
        """Ends the worker's thread soon (without waiting for it)."""


class _MainExit:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: weakref.WeakSet[Stoppable] = weakref.WeakSet()
        self._watcher: threading.Thread | None = None

    def register(self, worker: Stoppable) -> None:
        with self._lock:
            self._workers.add(worker)
            # A watcher that is not alive: none yet, or none in this process after a fork
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="kspec-main-exit", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        threading.main_thread().join()
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.stop()


_MAIN_EXIT = _MainExit()


def stop_at_main_exit(worker: Stoppable) -> None:
    """`worker.stop()` is called when the main thread ends (unless `worker` is gone by then)."""
    _MAIN_EXIT.register(worker)
