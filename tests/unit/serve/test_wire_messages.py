"""The typed messages between engines and their clients (engine/serve/wire.py): every kind crosses
the wire as itself, and what does not decode is the user's one-line error."""

from __future__ import annotations

import typing

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kspec.engine.api import Completion, CompletionRequest, CompletionResult, ContextFile, ModuleMembers
from kspec.engine.errors import DeadlineExceeded, InputError, ProtocolError
from kspec.engine.serve.status import READY, Status
from kspec.engine.serve.wire import Cancel, Complete, Failed, Final, Hello, Interim, Message, decode, encode, envelope

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)  # no lone surrogates: msgpack cannot carry them
ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
numbers = st.floats(allow_nan=False, width=64)
small = st.integers(-(2**31), 2**31)
requests = st.builds(
    CompletionRequest,
    prefix=text, suffix=text, language=text, path=text, k=small, max_tokens=small, mode=st.sampled_from(("diverse", "sample")),
    temperature=numbers, top_p=numbers, seed=small, deadline_ms=numbers, first_answer_ms=numbers, raw=st.booleans(),
    request_id=text, stop=st.lists(text, max_size=3).map(tuple), cursor_rules=st.booleans(),
    context=st.lists(st.builds(ContextFile, text, text), max_size=3).map(tuple),
    members=st.lists(st.builds(ModuleMembers, text, st.lists(text, max_size=3).map(tuple)), max_size=3).map(tuple),
)  # fmt: skip
results = st.builds(
    CompletionResult,
    st.lists(st.builds(Completion, text, numbers, numbers, small, text), max_size=3),
    text,
    st.dictionaries(text, numbers, max_size=3),
)
statuses = st.builds(
    Status,
    st.sampled_from(("loading", "ready", "error")), text, st.none() | numbers, text, st.none() | numbers, st.none() | small,
    st.none() | st.dictionaries(text, numbers, max_size=3), st.none() | st.dictionaries(text, text, max_size=3),
)  # fmt: skip
EVERY_KIND: dict[type, st.SearchStrategy] = {
    Hello: st.builds(Hello, small, st.none() | text, st.none() | small, st.none() | statuses),
    Complete: st.builds(Complete, ids, requests),
    Cancel: st.builds(Cancel, ids),
    Interim: st.builds(Interim, ids, results),
    Final: st.builds(Final, ids, results),
    Failed: st.builds(Failed, st.none() | ids, st.sampled_from(("input", "deadline", "unavailable", "cancelled", "protocol")), text),
    Status: statuses,
}


def test_the_round_trip_covers_every_kind() -> None:
    assert set(EVERY_KIND) == set(typing.get_args(Message))


@settings(max_examples=300, deadline=None)
@given(st.one_of(*EVERY_KIND.values()))
def test_every_message_crosses_the_wire_as_itself(message: Message) -> None:
    assert decode(encode(message)) == message


def test_a_failure_is_raised_as_the_engine_raised_it() -> None:
    decoded = decode(encode(Failed.of("r3", DeadlineExceeded("late"))))
    assert isinstance(decoded, Failed) and isinstance(decoded.error(), DeadlineExceeded) and str(decoded.error()) == "late"


def test_the_wire_is_a_map_named_by_its_type() -> None:
    """What other implementations read: the kinds' names, and defaults left out."""
    wire = msgspec.msgpack.decode(encode(Hello(1, pid=7, status=Status(READY, model="m"))))
    assert wire == {"type": "hello", "version": 1, "pid": 7, "status": {"type": "status", "state": "ready", "model": "m"}}
    names = {kind: msgspec.msgpack.decode(encode(example))["type"] for kind, example in (
        (Complete, Complete("1", CompletionRequest("x"))), (Cancel, Cancel("1")), (Interim, Interim("1", CompletionResult([], "m"))),
        (Final, Final("1", CompletionResult([], "m"))), (Failed, Failed("1", "input", "no")), (Status, Status(READY)),
    )}  # fmt: skip
    assert names == {Complete: "complete", Cancel: "cancel", Interim: "early", Final: "result", Failed: "error", Status: "status"}


def raw(data: object) -> bytes:
    return msgspec.msgpack.encode(data)


@pytest.mark.parametrize(
    ("request_map", "said"),
    [
        ({"prefix": "a", "k": "2"}, "request field 'k': Expected `int`, got `str`"),
        ({"prefix": "a", "k": 2.0}, "request field 'k': Expected `int`, got `float`"),
        ({"prefix": "a", "raw": 1}, "request field 'raw': Expected `bool`, got `int`"),
        ({"prefix": "a", "stop": ["\n", 3]}, "request field 'stop[1]': Expected `str`, got `int`"),
        ({"suffix": "x"}, "request: Object missing required field `prefix`"),
        ({"prefix": "x", "members": ["m"]}, "request field 'members[0]': Expected `object`, got `str`"),
        ({"prefix": "x", "context": [{"path": "a", "text": "y"}] * 65}, "request field 'context' must be a list of at most 64"),
        (None, "request: Expected `object`, got `None`"),
    ],
)
def test_a_request_that_is_not_one_is_the_clients_one_line_input_error(request_map: object, said: str) -> None:
    with pytest.raises(InputError) as raised:
        decode(raw({"type": "complete", "id": "1", "request": request_map}))
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"type": "shout", "id": "1"}, "unknown message type 'shout'"),
        ({"type": "result", "id": "1", "result": {"completions": "nope"}}, "malformed 'result' message: Expected `array`, got `str`"),
        ({"type": "cancel", "id": 7}, "malformed 'cancel' message: Expected `str`, got `int`"),
        ({"type": "status", "state": "ready", "latency_ms": "fast"}, "malformed 'status' message: Expected `float | null`, got `str`"),
        ({"id": "1"}, "malformed message: Object missing required field `type`"),
        ([1, 2], "malformed message: Expected `object`, got `array`"),
    ],
)
def test_a_malformed_or_unknown_message_is_a_one_line_protocol_error(data: object, said: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        decode(raw(data))
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


def test_bytes_that_are_no_msgpack_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="malformed frame"):
        decode(b"\xc1")
    with pytest.raises(ProtocolError, match="malformed frame"):
        decode(encode(Cancel("1"))[:-1])


def test_the_envelope_of_what_does_not_decode_names_its_type_and_id() -> None:
    """So that a failure is answered for the request it concerns."""
    assert envelope(raw({"type": "complete", "id": 12, "request": None})) == envelope(raw({"type": "complete", "id": "12"}))
    assert envelope(raw({"type": "complete", "id": "12"})).id == "12" and envelope(raw({"type": 3})).type is None
    assert envelope(b"\xc1").id is None and envelope(raw([1])).type is None
