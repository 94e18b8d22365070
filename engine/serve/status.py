"""What an engine tells its clients about itself: loading (with progress), ready, or failed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def to_wire(self) -> dict[str, Any]:
        """The status as the daemon and the network engine send it (msgprotocol.py frames)."""
        return {"type": "status", **{name: getattr(self, name) for name in _WIRE_FIELDS}}

    @classmethod
    def from_wire(cls, data: Any, engine_pid: int | None) -> "Status":
        """A status received from an engine (whose pid is `engine_pid`); a field of the wrong type
        is dropped, a message that is no status reads as "connected"."""
        if not isinstance(data, dict):
            return cls(LOADING, "connected", engine_pid=engine_pid)
        progress, latency = data.get("progress"), data.get("latency_ms")
        defaults, attention = data.get("defaults"), data.get("attention")
        if not (isinstance(defaults, dict) and all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in defaults.items())):
            defaults = None
        if not (isinstance(attention, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in attention.items())):
            attention = None
        return cls(
            state=str(data.get("state", LOADING)),
            message=str(data.get("message", "")),
            progress=float(progress) if isinstance(progress, (int, float)) else None,
            model=str(data.get("model", "")),
            latency_ms=float(latency) if isinstance(latency, (int, float)) else None,
            engine_pid=engine_pid,
            defaults={k: float(v) for k, v in defaults.items()} if defaults else None,
            attention=dict(attention) if attention else None,
        )

    def to_dict(self) -> dict:
        """The status as an editor is told it (`$/kspec/status`, camelCase)."""
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


_WIRE_FIELDS = ("state", "message", "progress", "model", "latency_ms", "defaults", "attention")  # engine_pid: the receiver's


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)
