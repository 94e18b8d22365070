"""The quality bench, driven by a scripted engine (no model): holes, judging, JSON shape."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.bench.quality import (
    QualityBenchConfig, cut_window, load_holes, replay_quality_bench, run_quality_bench, stdlib_holes, widen,
)

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")

SMALL = QualityBenchConfig(humaneval_single=2, humaneval_multi=2, mbxp_per_language=1, stdlib=2, timing_repeats=1)


class ScriptedEngine:
    """Knows every hole's reference; answers with the reference plus junk, and a broken text."""

    model_name = "scripted"

    def __init__(self, references: dict[str, str]) -> None:
        self.references = references
        self.requests: list[CompletionRequest] = []

    def complete(self, request: CompletionRequest) -> CompletionResult:
        self.requests.append(request)
        reference = self.references[request.request_id]
        texts = [
            reference.rstrip("\n") + "\n)))) junk (((\n",  # right unit, then garbage
            "((( broken",
            reference,
        ]
        return CompletionResult([Completion(t, -1.0 - i, -1.0 - i, 5) for i, t in enumerate(texts)], "scripted")


def test_holes_are_seeded_and_sized() -> None:
    holes = load_holes(DATA, SMALL)
    assert [h.id for h in holes] == [h.id for h in load_holes(DATA, SMALL)]
    assert len(holes) == 2 + 2 + 4 + 2
    assert {h.language for h in holes} == {"python", "java", "javascript", "typescript", "cpp"}
    assert sum(h.source == "stdlib" for h in holes) == 2
    for hole in holes:
        assert hole.reference.strip()
        if hole.source.startswith(("mbxp", "stdlib")):
            assert "\n" not in hole.reference  # one line, or the rest of one
    other_seed = load_holes(DATA, QualityBenchConfig(humaneval_single=2, humaneval_multi=2, mbxp_per_language=1, stdlib=2, seed=1))
    assert [h.id for h in other_seed] != [h.id for h in holes]


def test_bench_reports_raw_and_trimmed() -> None:
    # Single-line holes only: a multi-line reference is several statements, and trimming at
    # a line start keeps one (the rule), so "the reference plus junk" would not trim to it.
    config = QualityBenchConfig(humaneval_single=3, humaneval_multi=0, mbxp_per_language=1, stdlib=0, timing_repeats=1, windowed=False)
    holes = load_holes(DATA, config)
    engine = ScriptedEngine({h.id: h.reference for h in holes})
    report = run_quality_bench(engine, DATA, config)
    assert set(report) == {"raw", "trimmed", "meta"}
    assert all(r.raw and r.k == config.k for r in engine.requests)
    raw, trimmed = report["raw"], report["trimmed"]
    assert report["meta"]["cases"] == len(holes)
    # Raw shows the junk and the broken text; trimming cuts the junk and drops the broken one.
    assert raw["suggestions_shown"] == 3 * len(holes)
    assert raw["parse_break_rate"] >= 1 / 3
    assert trimmed["parse_break_rate"] == 0.0
    assert trimmed["exact_match_top1"] == 1.0  # the trimmed first alternative is the reference
    assert raw["exact_match_top1"] == 0.0
    assert trimmed["exact_match_best_of_k"] == raw["exact_match_best_of_k"] == 1.0
    assert trimmed["python_top1_static_error_rate"] == 0.0
    assert set(trimmed["postprocess_ms"]) == {"p50", "p90", "p95", "k8_p50", "k8_p90", "k8_p95", "k8_max", "k8_cpu_p50", "k8_cpu_p95"}
    assert trimmed["distinct_rate"] == 1.0 and trimmed["no_suggestion_rate"] == 0.0
    assert trimmed["best_of_k_over_top1"] == 1.0
    assert set(raw["by_language"]) == {"python", "java", "javascript", "typescript", "cpp"}


def test_widen_gives_distinct_candidates() -> None:
    base = [Completion("alpha beta\ngamma\n", logprob=-2.0, n_tokens=6), Completion("delta epsilon", logprob=-1.0, n_tokens=4)]
    wide = widen(base, 8)
    assert len(wide) == 8
    assert len({c.text for c in wide}) == 8
    assert wide[:2] == base


def test_a_model_that_writes_the_reference_and_keeps_going_gets_the_reference_back() -> None:
    """Over real holes: reference + the suffix's start (the usual way a model overshoots)."""
    from kspec.bench.quality import Judge
    from kspec.engine.syntax.rank import dedupe_key
    from kspec.engine.syntax import rank_alternatives

    config = QualityBenchConfig(humaneval_single=60, humaneval_multi=20, mbxp_per_language=10, seed=7)
    exact: dict[str, list[bool]] = {}
    for hole in load_holes(DATA, config):
        overshoot = Completion(hole.reference + hole.suffix[:200], logprob=-1.0, n_tokens=40, finish_reason="length")
        shown = [r.completion.text for r in rank_alternatives(hole.prefix, hole.suffix, hole.language, [overshoot])]
        assert len(shown) == 1, hole.id
        assert not Judge(hole).breaks_parse(shown[0]), hole.id
        exact.setdefault(hole.source, []).append(dedupe_key(shown[0]) == dedupe_key(hole.reference))
    for source, hits in exact.items():
        if source == "humaneval-multi":
            # A line start keeps one statement: a several-statement reference comes back whole
            # only when it is a single (compound) statement.
            assert sum(hits) >= len(hits) // 4, source
        else:
            assert all(hits), source


def test_windows_are_seeded_and_cut_anywhere() -> None:
    config = QualityBenchConfig(humaneval_single=20, humaneval_multi=10, mbxp_per_language=5, stdlib=6)
    holes = load_holes(DATA, config)
    windows = [cut_window(hole, config) for hole in holes]
    assert windows == [cut_window(hole, config) for hole in holes]
    for hole, window in zip(holes, windows):
        assert hole.prefix.endswith(window.prefix) and hole.suffix.startswith(window.suffix)
        assert len(window.prefix) <= config.window_before and len(window.suffix) <= config.window_after
    starts = {window.starts_in for window in windows}
    assert {"string", "comment", "code"} <= starts  # inside docstrings, comments, statements


def test_stdlib_holes_are_far_down_real_multi_function_files() -> None:
    import random

    holes = stdlib_holes(4, random.Random(0))
    assert len(holes) == 4
    for hole in holes:
        assert hole.prefix.count("\n") >= 40 and hole.prefix.count("def ") >= 2
        assert hole.reference.strip() and "\n" not in hole.reference


def test_windowed_figures_sit_beside_the_whole_file_ones_and_replay_gives_them_back() -> None:
    config = QualityBenchConfig(humaneval_single=2, humaneval_multi=0, mbxp_per_language=1, stdlib=1, timing_repeats=1)
    holes = load_holes(DATA, config)
    engine = ScriptedEngine({h.id: h.reference for h in holes})
    report = run_quality_bench(engine, DATA, config, details=True)
    assert set(report) == {"raw", "trimmed", "windowed", "meta", "cases"}
    assert set(report["windowed"]) == {"raw", "trimmed"}
    windowed_requests = [r for r in engine.requests if len(r.prefix) < len(next(h for h in holes if h.id == r.request_id).prefix)]
    assert windowed_requests  # the engine saw windows, not only whole files
    assert report["windowed"]["trimmed"]["cases"] == report["trimmed"]["cases"] == len(holes)
    replayed = replay_quality_bench(report["cases"], config)
    for variant in ("trimmed", "raw"):
        for key in ("exact_match_top1", "exact_match_best_of_k", "parse_break_rate", "no_suggestion_rate", "distinct_rate"):
            assert replayed[variant][key] == report[variant][key]
            assert replayed["windowed"][variant][key] == report["windowed"][variant][key]


class GreedyPeer:
    """A peer that answers one text: the reference for the first half of the holes, else a wrong line."""

    model_name = "peer"

    def __init__(self, references: dict[str, str]) -> None:
        self.references = references
        self.right = set(sorted(references)[: len(references) // 2])

    def complete(self, request: CompletionRequest) -> CompletionResult:
        text = self.references[request.request_id] if request.request_id in self.right else "undefined_thing()"
        return CompletionResult([Completion(text, 0.0, 0.0, 3)], "peer")


def test_kspec_beside_a_peer_on_the_same_holes() -> None:
    from kspec.bench.quality import beside_peer, first_lines

    config = QualityBenchConfig(humaneval_single=4, humaneval_multi=0, mbxp_per_language=0, stdlib=0, timing_repeats=1, windowed=False)
    holes = load_holes(DATA, config)
    references = {h.id: h.reference for h in holes}
    ours = run_quality_bench(ScriptedEngine(references), DATA, config)
    theirs = run_quality_bench(GreedyPeer(references), DATA, config, shown_by=first_lines)
    both = beside_peer(ours, theirs, "m.gguf")
    row = both["versus_peer"]["whole"]
    assert row["exact_match_top1"] == [1.0, 0.5, 0.5] and row["top1_over_peer"] == 2.0
    assert row["python_top1_undefined_name_rate"] == [0.0, 0.5, 0.5]  # the peer's wrong line reads an undefined name
    assert both["peer"]["file"] == "m.gguf" and both["peer"]["whole"]["as_returned"]["suggestions_shown"] == len(holes)
    assert "windowed" not in both["versus_peer"]


def test_a_peers_first_line_is_what_accept_a_line_takes() -> None:
    from kspec.bench.quality import Window, first_lines

    texts = ["\n    x = 1\n    y = 2\n", "z = 3", "   \n"]
    assert first_lines(Window("", "", "line-start", "end"), "python", [Completion(t, logprob=0.0, n_tokens=1) for t in texts]) == ["\n    x = 1\n", "z = 3"]


def test_the_peer_is_asked_as_llama_vim_asks() -> None:
    from kspec.bench.infill_peer import infill_body

    body = infill_body("import os\n\ndef f(x):\n    return os.pa", "\n\nf(1)\n", 48)
    assert body["input_prefix"] == "import os\n\ndef f(x):\n" and body["prompt"] == "    return os.pa"
    assert body["input_suffix"] == "\n\nf(1)\n" and body["n_indent"] == 4 and body["n_predict"] == 48 and body["temperature"] == 0


def test_a_window_carries_what_the_file_binds_outside_it_as_the_language_server_sends_it() -> None:
    from kspec.bench.quality import Hole, window_of

    prefix, suffix = "import json\n\ndef f(x):\n    return ", "\n\n\ndef g():\n    pass\n"
    hole = Hole("h", "stdlib", "python", prefix, suffix, "json.dumps(x)", "line")
    start, end = prefix.index("def f"), len(prefix) + 1
    window = window_of(hole, start, end, "code", "code")
    assert (window.prefix, window.suffix, window.outside_names) == (prefix[start:], "\n", ("g", "json"))
    assert window_of(replace(hole, language="javascript"), start, end, "code", "code").outside_names == ()
