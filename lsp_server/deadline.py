"""One engine request's time, fixed when it is sent: the engine has the user's `deadlineMs` to
answer, and the language server waits `ENGINE_GRACE_S` longer for what it returns. Every wait
of the request's engine work (the answer, the decoding on after an early answer, the work a
cancelled request leaves unattended) ends at the same moment, `Deadline.ends`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ENGINE_GRACE_S = 0.5  # on top of the request's deadline, for the engine to return what it has


@dataclass(frozen=True)
class Deadline:
    ms: float  # the engine's deadline, from `started`
    started: float = field(default_factory=time.perf_counter)  # time.perf_counter() when the request was sent
    ends: float = field(init=False)  # time.perf_counter() after which nothing of it is waited for

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", self.started + self.ms / 1000 + ENGINE_GRACE_S)

    def left_s(self) -> float:
        """Seconds left to wait (negative once `ends` passed)."""
        return self.ends - time.perf_counter()

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000

    def passed(self) -> bool:
        """The engine's deadline (not its grace) has passed."""
        return self.elapsed_ms() >= self.ms
