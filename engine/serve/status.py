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
    defaults: dict[str, float] | None = None  # what the engine chose for this machine (MachineDefaults.to_dict)
    attention: dict[str, str] | None = None  # the attention paths the model takes: {"prefill": ..., "decode": ...}

    def to_dict(self) -> dict:
        data = {"state": self.state, "message": self.message, "model": self.model}
        if self.progress is not None:
            data["progress"] = self.progress
        if self.latency_ms is not None:
            data["latencyMs"] = round(self.latency_ms, 1)
        if self.engine_pid is not None:
            data["enginePid"] = self.engine_pid
        if self.defaults is not None:
            data["defaults"] = {_camel(key): value for key, value in self.defaults.items()}
        if self.attention is not None:
            data["attention"] = dict(self.attention)
        return data


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)
