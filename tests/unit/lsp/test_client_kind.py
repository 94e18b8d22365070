"""A plain client is shown whole alternatives: cut-short ones keep only their complete lines."""

from __future__ import annotations

from kspec.engine.api import Completion
from kspec.lsp_server.client_kind import handles_updates, whole_alternatives, whole_text


def _c(text: str, reason: str) -> Completion:
    return Completion(text=text, score=0.0, finish_reason=reason)


def test_an_alternative_that_ended_by_itself_is_whole() -> None:
    assert whole_text(_c("return len", "stop")) == "return len"


def test_a_cut_short_alternative_keeps_only_its_complete_lines() -> None:
    assert whole_text(_c("return len", "deadline")) == ""  # a fragment ending mid-identifier
    assert whole_text(_c("lines = read(path)\n    return len", "deadline")) == "lines = read(path)"
    assert whole_text(_c("x = 1\n    y", "length")) == "x = 1\n    y"  # the budget the user chose: final
    assert whole_text(_c("x = 1\n    y", "cancelled")) == "x = 1"


def test_whole_alternatives_drop_empty_and_repeated_ones_in_rank_order() -> None:
    completions = [_c("a = 1\n    b", "deadline"), _c("Optional", "deadline"), _c("a = 1", "stop"), _c("c = 2", "eos")]
    kept = whole_alternatives(completions)
    assert [c.text for c in kept] == ["a = 1", "c = 2"]
    assert [c.finish_reason for c in kept] == ["deadline", "eos"]  # the first cut back to its whole line, the other as it came
    assert kept[1] is completions[3]


def test_only_an_explicit_declaration_asks_for_early_answers() -> None:
    assert handles_updates({"kspec": {"suggestionsUpdated": True}})
    assert not handles_updates(None) and not handles_updates({}) and not handles_updates({"kspec": {"suggestionsUpdated": 1}})
    assert not handles_updates([]) and not handles_updates({"kspec": []})
