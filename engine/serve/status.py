"""What an engine tells its clients about itself: loading (with progress), ready, or failed."""

from __future__ import annotations

from dataclasses import dataclass

LOADING, READY, ERROR = "loading", "ready", "error"


@dataclass(frozen=True)
class Status:
    state: str  # LOADING, READY or ERROR
    message: str = ""
    progress: float | None = None  # 0..1 while loading
    model: str = ""
    latency_ms: float | None = None  # of the last answered request
    engine_pid: int | None = None  # the daemon's pid, when there is one

    def to_dict(self) -> dict:
        data = {"state": self.state, "message": self.message, "model": self.model}
        if self.progress is not None:
            data["progress"] = self.progress
        if self.latency_ms is not None:
            data["latencyMs"] = round(self.latency_ms, 1)
        if self.engine_pid is not None:
            data["enginePid"] = self.engine_pid
        return data
