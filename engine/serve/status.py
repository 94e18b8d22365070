"""What an engine tells its clients about itself: loading (with progress), ready, or failed.

`Status` is one of the wire's messages (engine/serve/wire.py encodes and decodes it, its "type"
is "status"); the language server shows it to the editor in its own shape (lsp_server/status_report.py).
"""

from __future__ import annotations

import msgspec

LOADING, READY, ERROR = "loading", "ready", "error"


class Status(msgspec.Struct, frozen=True, tag="status", tag_field="type", omit_defaults=True):
    state: str  # LOADING, READY or ERROR
    message: str = ""
    progress: float | None = None  # 0..1 while loading
    model: str = ""
    latency_ms: float | None = None  # of the last answered request
    engine_pid: int | None = None  # the daemon's pid, when there is one
    defaults: dict[str, float] | None = None  # what the engine chose for this machine (MachineDefaults.to_dict)
    attention: dict[str, str] | None = None  # the attention paths the model takes: {"prefill": ..., "decode": ...}
    kernels: str = ""  # how the model computes on this CPU and why: the kernels chosen by measurement, with their times
