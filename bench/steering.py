"""`kspec bench quality --steering 0,1@-20`: the windowed quality bench (bench/quality.py) with
branch steering off and on, same holes, one engine (docs/measurements/branch-steering.md);
every case records whether a branch kept its forced start, so the cases no branch was steered
in show that the runs are otherwise alike.

The engine is not fitted to the machine (the fitted prompt budget moves with the load, and
with it every generation) and keeps no prefix cache (a prompt's KV reused from the previous
run would make the second run's numerics differ from the first's); drafting does not depend on
the load (a verification of many rows rounds differently from one row's step: near-ties can
flip). What differs between the runs is the steering alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from kspec.bench.quality import QualityBenchConfig, run_quality_bench
from kspec.engine.completion import CompletionEngine
from kspec.engine.config import EngineConfig

FIGURES = (
    ("no_suggestion_rate", "no suggestion"),
    ("python_top1_undefined_name_rate", "top-1 undefined name (Python)"),
    ("python_top1_static_error_rate", "top-1 undefined or unused (Python)"),
    ("exact_match_top1", "top-1 exact"),
    ("exact_match_best_of_k", "best-of-k exact"),
    ("best_of_k_over_top1", "best-of-k / top-1"),
    ("parse_break_rate", "shown that break the parse"),
)


def parse_settings(text: str) -> list[tuple[int, float]]:
    """'0,1@-20' -> [(0, default floor), (1, -20.0)]: steer_branches, and steer_min_logprob after '@'."""
    settings = []
    for item in (part for part in text.split(",") if part):
        branches, _, floor = item.partition("@")
        try:
            settings.append((int(branches), float(floor) if floor else EngineConfig.steer_min_logprob))
        except ValueError as exc:
            raise ValueError(f"--steering: {item!r} is not BRANCHES or BRANCHES@FLOOR (e.g. 0,1@-20)") from exc
    if not settings:
        raise ValueError("--steering: give at least one setting (e.g. 0,1@-20)")
    return settings


def compare_steering(
    config: EngineConfig, data: str, settings: list[tuple[int, float]], details: bool = False, log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """One report per setting, and the table of FIGURES side by side (whole file | windowed)."""
    engine = CompletionEngine.load(replace(config, progress=False, fit_to_machine=False, prefix_cache_mb=0, draft_only_when_paying=False))
    reports: dict[str, Any] = {}
    for branches, floor in settings:
        engine.config = replace(engine.config, steer_branches=branches, steer_min_logprob=floor)
        report = run_quality_bench(engine, data, QualityBenchConfig(), details=details)
        reports[f"{branches}@{floor:g}"] = report
        meta = report["meta"]
        log(f"steer_branches={branches}@{floor:g}: engine p50 {meta['engine_ms_p50']} ms, p95 {meta['engine_ms_p95']} ms, steered requests {meta['steered_requests']}")
    table = {
        label: {name: [report["trimmed"][key], report["windowed"]["trimmed"][key]] for name, report in reports.items()}
        for key, label in FIGURES
    }
    return {"table": table, "reports": reports}
