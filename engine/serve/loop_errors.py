"""Out of file descriptors (or memory for sockets) while accepting: one log line a burst.

asyncio's accept loop reports each failed accept() to the loop's exception handler with
a traceback, up to its backlog (100) times in one go, and again each second while the
limit lasts: under fd exhaustion the log filled with tracebacks of a state the operator
can act on only by raising `ulimit -n` (or finding who holds the descriptors)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("kspec.engine")

RESOURCE_MESSAGE = "socket.accept() out of system resource"  # asyncio's words (selector_events)
QUIET_S = 10.0  # one line per this long while it lasts


class ResourceErrors:
    """The loop's exception handler: accept() failures for lack of resources as one
    warning line per QUIET_S (with how many there were), anything else as asyncio would."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self._last = -float("inf")
        self._unreported = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != RESOURCE_MESSAGE:
            loop.default_exception_handler(context)
            return
        self._unreported += 1
        now = time.monotonic()
        if now - self._last < self.quiet_s:
            return
        error = context.get("exception")
        reason = getattr(error, "strerror", None) or error or "no resources"
        log.warning("cannot accept connections: %s (%d time(s); raise `ulimit -n` if this lasts); retrying", reason, self._unreported)
        self._last, self._unreported = now, 0


def quiet_resource_errors(loop: asyncio.AbstractEventLoop) -> None:
    loop.set_exception_handler(ResourceErrors())
