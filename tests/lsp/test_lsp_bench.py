"""The keystroke-replay bench runs through real servers and reports what it promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspec.bench.keystroke import bench_keystroke_lsp, typing_points

SOURCE = "import os\n\n\ndef main(argv):\n    # a comment\n    value = compute(argv)\n    return value + 1\n"


def test_typing_points_are_code_lines_spread_over_the_file() -> None:
    points = typing_points(SOURCE, 2, 10)
    assert len(points) == 2 and points[0] < points[1]
    for point in points:
        assert not SOURCE[point].isspace() and SOURCE[point] != "#"
    with pytest.raises(ValueError):
        typing_points(SOURCE, 50, 10)


def test_bench_reports_both_configurations(model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "typed.py"
    source.write_text(SOURCE * 3)
    report = bench_keystroke_lsp(source, model=str(model_dir), points=1, chars_per_point=4, cps=5.0, k=2, max_tokens=3, debounce_ms=0, deadline_ms=5000, raw=True)
    for key in ("p50_ms", "p95_ms", "typeahead_hit_rate", "cancelled_share", "baseline_p50_ms", "baseline_p95_ms"):
        assert key in report
    assert report["requests"] == 4
    assert 0.0 <= report["typeahead_hit_rate"] <= 1.0 and 0.0 <= report["cancelled_share"] <= 1.0
    assert report["answered"] >= 1 and report["p50_ms"] > 0  # at least the last keystroke is answered
    assert report["engine_calls"] >= 1 and report["baseline_engine_calls"] >= 1
