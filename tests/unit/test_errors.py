"""One mapping from errors to what the engine's surfaces answer (msgpack kind, HTTP status
and OpenAI error type), and back to the exception on the client's side."""

from __future__ import annotations

import asyncio

import pytest

from kspec.engine import errors
from kspec.engine.errors import (
    CancelledError,
    DeadlineExceeded,
    EngineUnavailable,
    InputError,
    KspecError,
    ModelLoadError,
    ProtocolError,
    describe,
    from_kind,
    from_status,
)
from kspec.engine.serve.openai_api import ApiError
from kspec.engine.serve.wire import Failed, decode, encode, envelope


@pytest.mark.parametrize(
    ("error", "kind", "status", "http_type"),
    [
        (InputError("bad k"), "input", 400, "invalid_request_error"),
        (DeadlineExceeded("late"), "deadline", 504, "timeout_error"),
        (EngineUnavailable("gone"), "unavailable", 503, "server_error"),
        (ModelLoadError("no such model"), "unavailable", 503, "server_error"),
        (KspecError("other"), "unavailable", 503, "server_error"),
        (CancelledError("stop"), "cancelled", 503, "server_error"),
        (ProtocolError("bad token"), "protocol", 400, "invalid_request_error"),
    ],
)
def test_each_error_answers_with_its_kind_and_status(error: KspecError, kind: str, status: int, http_type: str) -> None:
    answer = describe(error)
    assert (answer.kind, answer.http_status, answer.http_type, answer.message) == (kind, status, http_type, str(error))
    api = ApiError.of(error)
    assert (api.status, api.body()["error"]["type"], api.message) == (status, http_type, str(error))


def test_a_cancelled_task_and_a_bug_have_kinds_too() -> None:
    assert describe(asyncio.CancelledError()).kind == "cancelled"
    bug = describe(ZeroDivisionError("x"))
    assert (bug.kind, bug.http_status) == ("unavailable", 503) and "ZeroDivisionError" in bug.message


@pytest.mark.parametrize("error_type", [InputError, DeadlineExceeded, EngineUnavailable, CancelledError, ProtocolError])
def test_a_client_raises_what_the_engine_raised(error_type: type[KspecError]) -> None:
    frame = encode(Failed.of("r1", error_type("why")))
    assert envelope(frame) == envelope(encode(Failed("r1", "any", "")))  # the wire's "error", for request r1
    decoded = decode(frame)
    assert isinstance(decoded, Failed)
    raised = decoded.error()
    assert type(raised) is error_type and str(raised) == "why"
    assert type(from_kind(describe(error_type("why")).kind, "why")) is error_type


def test_statuses_back_to_errors() -> None:
    assert type(from_status(400, "m")) is InputError
    assert type(from_status(504, "m")) is DeadlineExceeded
    for status in (401, 404, 500, 503):
        assert type(from_status(status, "m")) is EngineUnavailable
    assert type(from_kind("no-such-kind", "m")) is EngineUnavailable
    assert type(from_kind(None, "m")) is EngineUnavailable


def test_every_error_class_is_described() -> None:
    """A new KspecError subclass inherits an answer; one with its own kind must be listed for clients."""
    classes = [value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, KspecError)]
    kinds = {cls.kind for cls in classes}
    assert kinds == {cls.kind for cls in errors._ANSWERS}


def test_the_apis_own_refusals_answer_as_an_input_error() -> None:
    refusal = ApiError.invalid("'n' must be an integer between 1 and 32", "n")
    expected = describe(InputError("x"))
    assert (refusal.status, refusal.body()["error"]["type"], refusal.param) == (expected.http_status, expected.http_type, "n")

