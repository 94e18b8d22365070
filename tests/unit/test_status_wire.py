"""The one status codec (engine/serve/status.py) between engines and their clients."""

from __future__ import annotations


def test_a_status_crosses_the_wire_unchanged_and_a_bad_field_is_dropped() -> None:
    """The one status codec (engine/serve/status.py): what the daemon sends, the client reads back."""
    from kspec.engine.serve.status import READY, Status

    status = Status(READY, "ready", progress=None, model="m", latency_ms=12.5, defaults={"k": 4.0}, attention={"decode": "cpu-fused"})
    assert Status.from_wire(status.to_wire(), engine_pid=7) == Status(**{**status.__dict__, "engine_pid": 7})
    assert Status.from_wire({**status.to_wire(), "latency_ms": "fast", "defaults": {"k": "four"}}, None).latency_ms is None
    assert Status.from_wire("not a status", 3) == Status("loading", "connected", engine_pid=3)
