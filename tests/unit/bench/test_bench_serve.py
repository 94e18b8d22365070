"""`kspec bench serve` on the small random model: every simulated editor is answered,
both configurations run, and the report carries what the README quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kspec.engine.config import EngineConfig
from kspec.bench.serve import ServeBenchConfig, bench_serve_inprocess, documents


def test_documents_differ_per_editor():
    docs = documents(16, ServeBenchConfig())
    assert len(docs) == 16 and len({(d.name, d.point) for d in docs}) == 16


def test_inprocess_bench_answers_every_editor(random_llama_dir: Path):
    config = ServeBenchConfig(editors=(1, 3), requests_per_editor=2, chars_per_burst=40, cps=10000.0, k=2, max_tokens=3)
    report = bench_serve_inprocess(EngineConfig(model=str(random_llama_dir), progress=False), config)
    for count in (1, 3):
        row = report["runs"][str(count)]
        for name in ("batched", "serial"):
            assert row[name]["answered"] == 2 * count and row[name]["errors"] == 0
            assert row[name]["p50_ms"] > 0 and row[name]["throughput_rps"] > 0
        assert row["throughput_batched_over_serial"] > 0
        assert row["serial"]["largest_batch"] == 1
        if count > 1:  # the editors' requests were verified together at least once
            assert 2 <= row["batched"]["largest_batch"] <= count


def test_config_is_validated():
    with pytest.raises(ValueError):
        ServeBenchConfig(editors=(0,))
