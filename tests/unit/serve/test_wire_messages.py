"""The typed messages between engines and their clients (engine/serve/messages.py) and the status codec."""

from __future__ import annotations


def test_a_status_crosses_the_wire_unchanged_and_a_bad_field_is_dropped() -> None:
    """The one status codec (engine/serve/status.py): what the daemon sends, the client reads back."""
    from kspec.engine.serve.status import READY, Status

    status = Status(READY, "ready", progress=None, model="m", latency_ms=12.5, defaults={"k": 4.0}, attention={"decode": "cpu-fused"})
    assert Status.from_wire(status.to_wire(), engine_pid=7) == Status(**{**status.__dict__, "engine_pid": 7})
    assert Status.from_wire({**status.to_wire(), "latency_ms": "fast", "defaults": {"k": "four"}}, None).latency_ms is None
    assert Status.from_wire("not a status", 3) == Status("loading", "connected", engine_pid=3)


def test_every_message_crosses_the_wire_as_itself() -> None:
    """encode then decode (through msgpack, as a frame carries it) gives back the same typed message."""
    import msgpack

    from kspec.engine.api import Completion, CompletionRequest, CompletionResult, ContextFile
    from kspec.engine.errors import DeadlineExceeded
    from kspec.engine.serve.messages import Cancel, Complete, Failed, Final, Interim, decode, encode
    from kspec.engine.serve.status import READY, Status

    result = CompletionResult([Completion("x = 1", 0.5, -1.25, 3, "stop")], "m", {"total": 12.5})
    messages = [
        Complete("r1", CompletionRequest(prefix="def f(", suffix=")", k=3, stop=("\n",))),
        Complete("r4", CompletionRequest(prefix="x = utils.", context=(ContextFile("pkg/utils.py", "def decode_params(p): ...\n"),))),
        Cancel("r1"), Interim("r2", result), Final("r2", result), Failed.of("r3", DeadlineExceeded("late")),
        Status(READY, "ready", model="m", latency_ms=3.0),
    ]
    for message in messages:
        wire = msgpack.unpackb(msgpack.packb(encode(message), use_bin_type=True), raw=False)
        assert decode(wire) == message, message
    assert isinstance(decode(encode(Failed.of("r3", DeadlineExceeded("late")))).error(), DeadlineExceeded)


def test_a_malformed_or_unknown_message_is_a_protocol_error() -> None:
    import pytest

    from kspec.engine.errors import InputError, ProtocolError
    from kspec.engine.serve.messages import decode

    with pytest.raises(ProtocolError, match="unknown message type"):
        decode({"type": "shout", "id": "1"})
    with pytest.raises(ProtocolError, match="malformed 'result'"):
        decode({"type": "result", "id": "1", "result": {"completions": "nope"}})
    with pytest.raises(InputError):  # a request that is not one fails as the client's mistake
        decode({"type": "complete", "id": "1", "request": {"suffix": "x"}})
