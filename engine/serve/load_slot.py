"""At most one engine of a process in memory or loading at a time (the language server's
in-process engines: a storm of model changes must not load twenty models at once).

A runner takes the slot before it loads and gives it back when its worker ends (its
engine freed). A runner stopped while it waits for the slot never loads; one stopped
while it loads abandons the load at its next progress report (`LoadCancelled`)."""

from __future__ import annotations

import threading
from typing import Callable


class LoadSlot:
    def __init__(self) -> None:
        self._free = threading.Condition()
        self._held = False

    def take(self, stopped: Callable[[], bool]) -> bool:
        """Waits until the slot is free (True: now held) or `stopped()` (False)."""
        with self._free:
            while self._held and not stopped():
                self._free.wait()
            if stopped():
                return False
            self._held = True
            return True

    def give_back(self) -> None:
        with self._free:
            self._held = False
            self._free.notify_all()

    def wake(self) -> None:
        """A waiting runner was stopped: it looks again."""
        with self._free:
            self._free.notify_all()
