"""The windowed quality bench (bench/quality.py) with branch steering off and on, same holes,
one engine (docs/measurements/branch-steering.md); every case records whether a branch kept its
forced start, so the cases no branch was steered in show that the runs are otherwise alike.

The engine is not fitted to the machine (the fitted prompt budget moves with the load, and
with it every generation) and keeps no prefix cache (a prompt's KV reused from the previous
run would make the second run's numerics differ from the first's): what differs between the
runs is the steering alone.

    .venv/bin/python scripts/steering_bench.py --settings 0,1@-20,1@-10 --out steering.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--settings", default="0,1", help="steer_branches values, comma-separated (0: off); BRANCHES@FLOOR also sets steer_min_logprob"
    )
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--out", type=Path, default=None, help="also write every report (cases included) here")
    args = parser.parse_args()
    # draft_only_when_paying off: which rounds draft must not depend on the machine's load (a
    # verification of many rows rounds differently from one row's step: near-ties can flip)
    engine = CompletionEngine.load(EngineConfig(progress=False, fit_to_machine=False, prefix_cache_mb=0, draft_only_when_paying=False))
    reports = {}
    for setting in args.settings.split(","):
        branches, _, floor = setting.partition("@")
        engine.config = replace(
            engine.config, steer_branches=int(branches), steer_min_logprob=float(floor or EngineConfig.steer_min_logprob)
        )
        report = run_quality_bench(engine, args.data, QualityBenchConfig(), details=args.out is not None)
        reports[setting] = report
        meta = report["meta"]
        print(f"steer_branches={setting}: engine p50 {meta['engine_ms_p50']} ms, p95 {meta['engine_ms_p95']} ms, "
              f"steered requests {meta['steered_requests']}", file=sys.stderr)  # fmt: skip
    header = "| figure | " + " | ".join(f"whole, steer {s} | windowed, steer {s}" for s in reports) + " |"
    print(header)
    print("|---" * (1 + 2 * len(reports)) + "|")
    for key, label in FIGURES:
        cells = []
        for report in reports.values():
            cells += [str(report["trimmed"][key]), str(report["windowed"]["trimmed"][key])]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for setting, report in reports.items():
        meta = report["meta"]
        print(f"| engine ms p50 / p95, steer {setting} | {meta['engine_ms_p50']} / {meta['engine_ms_p95']} | steered requests {meta['steered_requests']} |")
    if args.out is not None:
        args.out.write_text(json.dumps({str(s): r for s, r in reports.items()}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
