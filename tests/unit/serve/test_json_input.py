"""The one parser of JSON from outside: every failure is a JsonInputError."""

from __future__ import annotations

import pytest

from kspec.engine.serve.json_input import MAX_DEPTH, JsonInputError, parse_json


def test_values_and_errors() -> None:
    assert parse_json(b'{"a": [1, "[[["]}') == {"a": [1, "[[["]}
    with pytest.raises(JsonInputError, match="Expecting value at character 0"):
        parse_json("nope")
    with pytest.raises(JsonInputError):
        parse_json(b"\xff")


def test_deep_nesting_is_an_error_not_a_recursion_error() -> None:
    for text in ("[" * 100_000, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), '{"a":' * 900 + "1" + "}" * 900):
        with pytest.raises(JsonInputError, match="nested more than"):
            parse_json(text)
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH)
