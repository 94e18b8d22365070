"""How long a start takes, model by model, side by side: `python -m kspec.bench.load_time SPEC...`.

Each start is a new process that imports kspec and loads the model as the engine does (the CPU
fast path by default; no machine fit), timed from spawn to loaded. The first start of each model
may convert or quantize it (cached); then the models start in turn, their order flipped every
round, and the medians are compared with the first model's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

LOAD_SNIPPET = (
    "import sys; from kspec.engine.config import EngineConfig; from kspec.engine.models.loading import load_model; "
    "load_model(sys.argv[1], EngineConfig(progress=False, fit_to_machine=False))"
)


def start_seconds(spec: str) -> float:
    """Seconds from spawning a Python process to its model loaded."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", LOAD_SNIPPET, spec], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def load_times(specs: list[str], repeats: int) -> dict[str, Any]:
    first = {spec: round(start_seconds(spec), 2) for spec in specs}
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    for index in range(repeats):
        for spec in specs if index % 2 == 0 else specs[::-1]:
            times[spec].append(start_seconds(spec))
    medians = {spec: round(statistics.median(values), 2) for spec, values in times.items()}
    return {
        "first_start_s": first, "start_s": medians, "all_s": {s: [round(v, 2) for v in t] for s, t in times.items()},
        "over_first": {spec: round(medians[spec] / medians[specs[0]], 2) for spec in specs},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kspec.bench.load_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", help="models (.gguf files, HF folders) to start in turn")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(load_times(args.specs, args.repeats), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
