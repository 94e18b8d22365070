"""The keystroke-replay bench runs through real servers and reports what it promises."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsprotocol import types as lsp

from kspec.bench.keystroke import (
    PREDICT_CHARS,
    PREVIOUS_SETTINGS,
    Outcome,
    Run,
    _record,
    bench_keystroke_lsp,
    editor_initialize,
    known_settings,
    predicts,
    removed_end,
    still_to_type,
    typing_points,
)
from kspec.lsp_server.client_kind import handles_updates

SOURCE = "import os\n\n\ndef main(argv):\n    # a comment\n    value = compute(argv)\n    return value + 1\n"


def test_typing_points_are_code_lines_spread_over_the_file() -> None:
    points = typing_points(SOURCE, 2, 10)
    assert len(points) == 2 and points[0] < points[1]
    for point in points:
        assert not SOURCE[point].isspace() and SOURCE[point] != "#"
    with pytest.raises(ValueError):
        typing_points(SOURCE, 50, 10)


def test_a_suggestion_predicts_when_its_first_8_characters_are_the_next_8_typed() -> None:
    assert PREDICT_CHARS == 8
    assert predicts("compute(argv)", "compute(argv)\n")
    assert predicts("compute(x, y)", "compute(argv)")  # only the first 8 count: "compute("
    assert predicts("compute(", "compute(argv)")  # exactly 8 characters cover them
    assert not predicts("compute", "compute(argv)")  # right so far, but 7 characters do not cover 8
    assert not predicts("", "compute(argv)")
    assert not predicts("compute[argv]", "compute(argv)")  # the 8th differs
    assert not predicts(" compute(argv)", "compute(argv)")  # nothing is stripped: a leading space is wrong
    assert not predicts("Compute(argv)", "compute(argv)")
    assert predicts("x)\n    return x", "x)\n    return y")  # a newline and indentation are characters like others
    assert not predicts("x)\n  return x", "x)\n    return y")
    assert not predicts("argv)", "argv)")  # fewer than 8 left to type: never counted as predicted


def test_still_to_type_is_the_rest_of_the_removed_line_not_the_documents_suffix() -> None:
    point = SOURCE.index("value = compute")
    end = removed_end(SOURCE, point, 5)
    assert SOURCE[point:end] == "value = compute(argv)"  # the whole line from the point; its newline stays in the document
    assert still_to_type(SOURCE, point, 5, 1) == "alue = compute(argv)"  # beyond the 5 replayed characters too
    assert still_to_type(SOURCE, point, 5, 5) == " = compute(argv)"
    # a typed span running past its line removes through the end of the line it ends in
    end = removed_end(SOURCE, point, 25)
    assert SOURCE[point:end] == "value = compute(argv)\n    return value + 1"
    assert still_to_type(SOURCE, point, 25, 20) == ")\n    return value + 1"
    assert removed_end("x = 1", 0, 2) == 5  # no newline: the file's end


def test_prediction_shares_count_only_keystrokes_with_8_characters_left() -> None:
    left = "compute(argv)"
    run = Run(outcomes=[
        Outcome(sent=0.0, still_to_type=left, latency_ms=10.0, texts=("compute(argv)", "nope")),  # top and any
        Outcome(sent=0.0, still_to_type=left, latency_ms=20.0, texts=("comp", "compute(a")),  # any only (the top is too short)
        Outcome(sent=0.0, still_to_type=left, cancelled=True),  # not answered: counted, not predicted
        Outcome(sent=0.0, still_to_type="argv)", latency_ms=30.0, texts=("argv)",)),  # 5 left: not counted
    ], server_requests=5, typeahead_hits=1)  # fmt: skip
    summary = run.summary()
    assert summary["predict_keystrokes"] == 3
    assert summary["predict_top_share"] == round(1 / 3, 3)
    assert summary["predict_any_share"] == round(2 / 3, 3)
    assert summary["answered"] == 3 and summary["answered_share"] == 0.75
    assert summary["ttfs_p50_ms"] == 20.0 and summary["cancelled_share"] == 0.25
    assert summary["typeahead_hit_rate"] == 0.2


def test_an_answer_counts_only_before_the_next_keystroke_and_a_refresh_replaces_it() -> None:
    def answered(*texts: str) -> asyncio.Future:
        future = asyncio.Future(loop=asyncio.new_event_loop())
        future.set_result(lsp.InlineCompletionList(items=[lsp.InlineCompletionItem(insert_text=text) for text in texts]))
        return future

    outcome = Outcome(sent=1.0, still_to_type="compute(argv)")
    _record(answered(), outcome, 1.1)  # no items: no suggestion yet
    assert outcome.latency_ms is None and outcome.texts == ()
    _record(answered("comp", "co"), outcome, 1.2)
    assert outcome.texts == ("comp", "co") and outcome.latency_ms == pytest.approx(200)
    _record(answered("compute(argv)", "co"), outcome, 1.5, refresh=True)  # the longer version after the notification
    assert outcome.texts == ("compute(argv)", "co") and outcome.refreshed
    assert outcome.latency_ms == pytest.approx(200)  # time to the *first* suggestion
    outcome.closed = True  # the next keystroke came
    _record(answered("late"), outcome, 2.0, refresh=True)
    assert outcome.texts == ("compute(argv)", "co")


def test_the_previous_configuration_sends_only_settings_the_server_knows() -> None:
    sent, not_sent = known_settings({**PREVIOUS_SETTINGS, "notASetting": 1})
    assert not_sent == ["notASetting"]
    assert sent["dtype"] == "float32" and "notASetting" not in sent


def test_the_replay_speaks_as_our_editors_do() -> None:
    """It measures our clients: they declare $/kspec/suggestionsUpdated (without it the replay
    measured a plain client, with no early answers: 21-29 of 80 answered, not 60-62)."""
    assert handles_updates(editor_initialize({}).capabilities.experimental)


def test_bench_reports_both_configurations(model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "typed.py"
    text = SOURCE * 3
    source.write_text(text)
    point = typing_points(text, 1, 4)[0]
    counted = sum(len(still_to_type(text, point, 4, typed)) >= 8 for typed in range(1, 5))
    report = bench_keystroke_lsp(source, model=str(model_dir), points=1, chars_per_point=4, cps=5.0, k=2, max_tokens=3, debounce_ms=0, deadline_ms=5000, raw=True)
    assert report["predict_chars"] == 8
    assert report["settings"]["previous"]["dtype"] == "float32" and "dtype" not in report["settings"]["kspec"]
    for name in ("kspec", "previous"):
        figures = report[name]
        assert figures["requests"] == 4
        for key in ("answered_share", "predict_top_share", "predict_any_share", "typeahead_hit_rate", "cancelled_share"):
            assert 0.0 <= figures[key] <= 1.0, (name, key, figures)
        assert figures["predict_any_share"] >= figures["predict_top_share"]
        assert figures["predict_keystrokes"] == counted
        assert figures["answered"] >= 1 and figures["ttfs_p50_ms"] > 0  # at least the last keystroke is answered
        assert figures["ttfs_p95_ms"] >= figures["ttfs_p50_ms"]
        assert figures["engine_calls"] >= 1 and figures["refreshes"] >= 0
