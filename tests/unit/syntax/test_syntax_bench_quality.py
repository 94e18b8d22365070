"""The quality bench, driven by a scripted engine (no model): holes, judging, JSON shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.bench.quality import QualityBenchConfig, load_holes, run_quality_bench, widen
from kspec.engine.syntax import Candidate

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")

SMALL = QualityBenchConfig(humaneval_single=2, humaneval_multi=2, mbxp_per_language=1, timing_repeats=1)


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
    assert len(holes) == 2 + 2 + 4
    assert {h.language for h in holes} == {"python", "java", "javascript", "typescript", "cpp"}
    for hole in holes:
        assert hole.reference.strip()
        if hole.source.startswith("mbxp"):
            assert "\n" not in hole.reference  # one line, or the rest of one
    other_seed = load_holes(DATA, QualityBenchConfig(humaneval_single=2, humaneval_multi=2, mbxp_per_language=1, seed=1))
    assert [h.id for h in other_seed] != [h.id for h in holes]


def test_bench_reports_raw_and_trimmed() -> None:
    # Single-line holes only: a multi-line reference is several statements, and trimming at
    # a line start keeps one (the rule), so "the reference plus junk" would not trim to it.
    config = QualityBenchConfig(humaneval_single=3, humaneval_multi=0, mbxp_per_language=1, timing_repeats=1)
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
    assert set(trimmed["postprocess_ms"]) == {"p50", "p90", "k8_p50", "k8_p90", "k8_max"}
    assert set(raw["by_language"]) == {"python", "java", "javascript", "typescript", "cpp"}


def test_widen_gives_distinct_candidates() -> None:
    base = [Candidate("alpha beta\ngamma\n", -2.0, 6), Candidate("delta epsilon", -1.0, 4)]
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
        overshoot = Candidate(hole.reference + hole.suffix[:200], -1.0, 40, finish_reason="length")
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
