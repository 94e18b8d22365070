"""`kspec bench quality --execute`: do the suggestions *run*? pass@first and pass@all within a
time budget, per k (the BASS paper's table: a passing program first, and among the k).

Tasks (../shared/data, read-only, never copied into the repo):
* HumanEval-infilling SingleLine and MultiLine: prefix = `prompt`, suffix = `suffix`, the
  hole is `canonical_solution`; the program is prefix + suggestion + suffix + `test` +
  `check(entry_point)`;
* MBXP where a runtime exists here: Python (MBPP, `python3 -I`) and JavaScript (MBJSP,
  `node`); one line of the reference solution is the hole, cut as `kspec bench quality`
  cuts MBXP holes (the whole line from its indentation, or half the time its rest from a
  token boundary); the program is prompt + solution with the suggestion in the hole + `test`.
  MBJSP's tests `require("lodash")` for `_.isEqual` only; lodash is not installed here, so the
  task's folder gets a one-line module `lodash` whose `isEqual` is node's
  `util.isDeepStrictEqual` (stated in the report's meta). TypeScript, Java, C++ and Go are
  not run (`SKIPPED_LANGUAGES` says why).
A task counts only if its reference program passes in the sandbox and the program with the
hole left empty fails (a hole that is only a comment tests nothing); both kinds are listed.

Every (task, k, budget) is one real request with `deadline_ms` = the budget: the engine's own
deadline (prefill counts; at the deadline each branch keeps what it completed, the
unfinished last line dropped) decides what comes back, trimmed and ranked as in an editor.
No answer is filtered after the fact. By default every request starts cold (the prefix
cache cleared: a task is a new file); `warm_prompt` prefills the prompt first, untimed, as
the keystroke before would have (the language server's case).

Each returned alternative is run in the sandbox (`bench/sandbox.py`) against the task's own
tests. Per k x budget: `pass_at_first` (the top-ranked alternative passes), `pass_at_all`
(any of the returned alternatives passes), `empty_rate` (nothing returned) and the request's
wall-clock latency (p50, p95, max), over the same tasks.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from kspec.bench.quality import HUMANEVAL_FILES, MBXP_FILES, cut_line_hole, request_options
from kspec.bench.sandbox import Sandbox, SandboxLimits, find_runtime
from kspec.bench.stats import percentile, rounded
from kspec.engine.api import CompletionRequest, CompletionResult

MBPP_FILE = "mbpp_release_v1.jsonl.gz"
LODASH_SHIM = "module.exports = { isEqual: require('util').isDeepStrictEqual };\n"
RUNTIMES = {"python": "python3", "javascript": "node"}  # language -> executable
SKIPPED_LANGUAGES = {
    "typescript": "no TypeScript runtime here (node 20 does not strip types; no tsc/ts-node installed)",
    "java": "not wired up yet (the JVM needs its own memory limits: an address-space limit breaks it)",
    "cpp": "not wired up yet (needs a compile step per program)",
    "go": "MBGP has no reference solutions",
}
DEFAULT_KS = (1, 4, 8)
DEFAULT_BUDGETS_S = (0.25, 0.5, 1.0, 2.0)
WARMUP_DEADLINE_MS = 120_000.0
EPSILON = 1e-9  # rates are rounded to 4 digits: 1.5 * 0.2 must count as 0.3


class CompletesRequests(Protocol):
    model_name: str

    def complete(self, request: CompletionRequest) -> CompletionResult: ...

    def clear_caches(self) -> None: ...


@dataclass(frozen=True)
class ExecutedBenchConfig:
    humaneval_single: int = 8
    humaneval_multi: int = 8
    mbxp_per_language: int = 4  # per language in `languages` other than HumanEval's Python
    mbxp_languages: tuple[str, ...] = ("python", "javascript")
    full: bool = False  # every task of every source (thousands: hours on a CPU)
    ks: tuple[int, ...] = DEFAULT_KS
    budgets_s: tuple[float, ...] = DEFAULT_BUDGETS_S
    max_tokens: int = 128  # a budget, not this, should end a multi-line answer
    seed: int = 0
    warm_prompt: bool = False  # prefill each prompt first, untimed (the previous keystroke's)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    # the requests' branch choice (CompletionRequest): None keeps the request's default
    others_temperature: float | None = None
    top_p: float = 1.0
    request_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("humaneval_single", "humaneval_multi", "mbxp_per_language"):
            if getattr(self, name) < 0:
                raise ValueError(f"ExecutedBenchConfig.{name} must be >= 0")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError("ExecutedBenchConfig.ks must be one or more k >= 1")
        if not self.budgets_s or any(b <= 0 for b in self.budgets_s):
            raise ValueError("ExecutedBenchConfig.budgets_s must be one or more budgets > 0")
        if self.max_tokens < 1:
            raise ValueError("ExecutedBenchConfig.max_tokens must be >= 1")
        unknown = set(self.mbxp_languages) - set(RUNTIMES) - set(SKIPPED_LANGUAGES)
        if unknown:
            raise ValueError(f"ExecutedBenchConfig.mbxp_languages: unknown {sorted(unknown)}")


@dataclass(frozen=True)
class ExecTask:
    """A hole whose filled program can be run: `program(text)` is the whole file with `text` in the hole."""

    id: str
    source: str  # humaneval-single, humaneval-multi, mbxp-python, mbxp-javascript
    language: str
    prefix: str
    suffix: str
    reference: str
    test: str
    entry_point: str

    def program(self, text: str) -> str:
        filled = self.prefix + text + self.suffix
        if self.language == "python":
            return f"{filled}\n\n{self.test}\n\ncheck({self.entry_point})\n"
        return f"{filled}\n{self.test}\n"

    def files(self, text: str) -> dict[str, str]:
        """The task's folder: the program, and for JavaScript the lodash stand-in its tests require."""
        if self.language == "python":
            return {"prog.py": self.program(text)}
        return {"prog.js": self.program(text), "node_modules/lodash/index.js": LODASH_SHIM}

    def command(self) -> list[str]:
        return ["python3", "-I", "prog.py"] if self.language == "python" else ["node", "prog.js"]


# ------------------------------------------------------------------------------ tasks

def _read_jsonl_gz(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _sample(rows: list[dict[str, Any]], count: int, full: bool, rng: random.Random) -> list[dict[str, Any]]:
    return list(rows) if full else rng.sample(rows, min(count, len(rows)))


def humaneval_tasks(data_dir: Path, source: str, count: int, rng: random.Random, full: bool = False) -> list[ExecTask]:
    rows = _read_jsonl_gz(data_dir / "human-eval-infilling" / HUMANEVAL_FILES[source])
    return [
        ExecTask(r["task_id"], source, "python", r["prompt"], r["suffix"], r["canonical_solution"], r["test"], r["entry_point"])
        for r in _sample(rows, count, full, rng)
    ]


def mbxp_tasks(data_dir: Path, language: str, count: int, rng: random.Random, full: bool = False) -> list[ExecTask]:
    """One line of each sampled reference solution is the hole (cut as the quality bench cuts MBXP holes)."""
    name = MBPP_FILE if language == "python" else MBXP_FILES[language]
    rows = [r for r in _read_jsonl_gz(data_dir / "mbxp" / name) if r.get("canonical_solution")]
    tasks: list[ExecTask] = []
    for row in rows if full else rng.sample(rows, len(rows)):
        if not full and len(tasks) >= count:
            break
        text = row["prompt"] + row["canonical_solution"]
        hole = cut_line_hole(row["task_id"], f"mbxp-{language}", language, text, len(row["prompt"]), rng)
        if hole is not None:
            tasks.append(ExecTask(hole.id, hole.source, language, hole.prefix, hole.suffix, hole.reference, row["test"], row["entry_point"]))
    return tasks


def load_tasks(data_dir: str | Path, config: ExecutedBenchConfig) -> tuple[list[ExecTask], dict[str, str]]:
    """The seeded sample (same config, same tasks) and the languages left out, with why."""
    root = Path(data_dir)
    rng = random.Random(config.seed)
    tasks = humaneval_tasks(root, "humaneval-single", config.humaneval_single, rng, config.full)
    tasks += humaneval_tasks(root, "humaneval-multi", config.humaneval_multi, rng, config.full)
    skipped: dict[str, str] = {}
    for language in config.mbxp_languages:
        if language in SKIPPED_LANGUAGES:
            skipped[language] = SKIPPED_LANGUAGES[language]
        elif find_runtime(RUNTIMES[language]) is None:
            skipped[language] = f"{RUNTIMES[language]} is not installed"
        else:
            tasks += mbxp_tasks(root, language, config.mbxp_per_language, random.Random(f"{config.seed}-{language}"), config.full)
    if find_runtime("python3") is None and any(t.language == "python" for t in tasks):
        raise RuntimeError("python3 is not installed where the sandbox looks (/usr/local/bin, /usr/bin, /bin, PATH)")
    return tasks, skipped


# ------------------------------------------------------------------------------ scoring

@dataclass(frozen=True)
class Outcome:
    """One answer: whether each returned alternative (in ranked order) passed, and how long it took."""

    passed: tuple[bool, ...]
    latency_ms: float

    @property
    def first(self) -> bool:
        return bool(self.passed) and self.passed[0]

    @property
    def any(self) -> bool:
        return any(self.passed)


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """pass@first, pass@all, empty rate and latency over the outcomes of one k x budget."""
    n = len(outcomes)
    latencies = [o.latency_ms for o in outcomes]

    def rate(count: int) -> float | None:
        return round(count / n, 4) if n else None

    return {
        "tasks": n,
        "pass_at_first": rate(sum(o.first for o in outcomes)),
        "pass_at_all": rate(sum(o.any for o in outcomes)),
        "empty_rate": rate(sum(not o.passed for o in outcomes)),
        "alternatives_mean": round(statistics.mean(len(o.passed) for o in outcomes), 2) if n else None,
        "latency_ms": {
            "p50": rounded(percentile(latencies, 50)), "p95": rounded(percentile(latencies, 95)),
            "max": rounded(max(latencies)) if latencies else None,
        },
    }


def goals(cells: dict[tuple[int, float], dict[str, Any]]) -> dict[str, Any]:
    """The executed goals, where the table has the cells they compare: pass@all at k = 4 at least
    1.5x pass@first at k = 1 (1 s); pass@first at k = 4 not below k = 1 at any budget; pass@all at
    k = 4 in 0.5 s not below pass@first at k = 1 in 2 s."""
    def value(k: int, budget: float, key: str) -> float | None:
        cell = cells.get((k, budget))
        return None if cell is None else cell[key]

    out: dict[str, Any] = {}
    all4, first1 = value(4, 1.0, "pass_at_all"), value(1, 1.0, "pass_at_first")
    if all4 is not None and first1 is not None:
        out["pass_at_all_k4_over_pass_at_first_k1_at_1s"] = {
            "pass_at_all_k4": all4, "pass_at_first_k1": first1, "goal": ">= 1.5x", "met": all4 > 0 and all4 >= 1.5 * first1 - EPSILON,
        }
    budgets = sorted({b for _, b in cells})
    pairs = [(b, value(4, b, "pass_at_first"), value(1, b, "pass_at_first")) for b in budgets]
    pairs = [(b, four, one) for b, four, one in pairs if four is not None and one is not None]
    if pairs:
        out["pass_at_first_k4_not_below_k1"] = {
            "by_budget_s": {str(b): {"k4": four, "k1": one} for b, four, one in pairs},
            "met": all(four >= one - EPSILON for _, four, one in pairs),
        }
    fast, slow = value(4, 0.5, "pass_at_all"), value(1, 2.0, "pass_at_first")
    if fast is not None and slow is not None:
        out["pass_at_all_k4_at_0.5s_vs_pass_at_first_k1_at_2s"] = {
            "pass_at_all_k4_0.5s": fast, "pass_at_first_k1_2s": slow, "met": fast >= slow - EPSILON,
        }
    return out


# ------------------------------------------------------------------------------ the run

class Executor:
    """Runs filled programs in the sandbox, each distinct (task, text) once per bench run."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self._seen: dict[tuple[str, str], bool] = {}
        self.runs = 0
        self.statuses: dict[str, int] = {}

    def passes(self, task: ExecTask, text: str) -> bool:
        key = (task.id, text)
        if key not in self._seen:
            result = self.sandbox.run(task.command(), task.files(text))
            self.runs += 1
            self.statuses[result.status] = self.statuses.get(result.status, 0) + 1
            self._seen[key] = result.passed
        return self._seen[key]


def _load_average() -> float | None:
    """The machine's 1-minute load average (other work competes with the engine for the cores)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _request(task: ExecTask, k: int, max_tokens: int, deadline_ms: float, config: ExecutedBenchConfig | None = None) -> CompletionRequest:
    return CompletionRequest(
        prefix=task.prefix, suffix=task.suffix, language=task.language, k=k, max_tokens=max_tokens,
        deadline_ms=deadline_ms, request_id=task.id, **(request_options(config) if config is not None else {}),
    )  # fmt: skip


def run_executed_bench(
    engine: CompletesRequests,
    data_dir: str | Path,
    config: ExecutedBenchConfig = ExecutedBenchConfig(),
    sandbox: Sandbox | None = None,
    progress: Callable[[str], None] | None = None,
    details: bool = False,
) -> dict[str, Any]:
    """Every task x k x budget through `engine`, every alternative run against the task's
    tests. -> {"table": [cell per k x budget], "by_source": ..., "goals": ..., "meta": ...}
    (with `details`, "cases": every answer's texts and outcomes)."""
    sandbox = sandbox or Sandbox(config.limits)
    executor = Executor(sandbox)
    tasks, skipped_languages = load_tasks(data_dir, config)
    reference_fails = [t.id for t in tasks if not executor.passes(t, t.reference)]
    empty_passes = [t.id for t in tasks if t.id not in reference_fails and executor.passes(t, "")]
    valid = [t for t in tasks if t.id not in set(reference_fails) | set(empty_passes)]
    outcomes: dict[tuple[int, float], list[tuple[ExecTask, Outcome]]] = {(k, b): [] for k in config.ks for b in config.budgets_s}
    records: list[dict[str, Any]] = []
    warmup = valid[0] if valid else None
    if warmup is not None:  # first passes allocate and load kernels: not a task's time
        engine.complete(_request(warmup, max(config.ks), 8, WARMUP_DEADLINE_MS))
    started, load_before = time.perf_counter(), _load_average()
    for number, task in enumerate(valid, 1):
        for budget in config.budgets_s:
            for k in config.ks:
                engine.clear_caches()
                if config.warm_prompt:
                    engine.complete(_request(task, 1, 1, WARMUP_DEADLINE_MS))
                began = time.perf_counter()
                result = engine.complete(_request(task, k, config.max_tokens, budget * 1000, config))
                latency = (time.perf_counter() - began) * 1000
                texts = [c.text for c in result.completions]
                outcome = Outcome(tuple(executor.passes(task, t) for t in texts), latency)
                outcomes[(k, budget)].append((task, outcome))
                if details:
                    records.append({"id": task.id, "source": task.source, "k": k, "budget_s": budget, "texts": texts,
                                    "passed": list(outcome.passed), "latency_ms": round(latency, 1),
                                    "timing_ms": {n: round(v, 1) for n, v in result.timing_ms.items()}})  # fmt: skip
        if progress is not None:
            progress(f"[{number}/{len(valid)}] {task.id}")
    report = _report(outcomes, config, engine.model_name, valid, reference_fails, empty_passes, skipped_languages,
                     executor, time.perf_counter() - started)  # fmt: skip
    report["meta"]["load_average_1m"] = {"start": load_before, "end": _load_average(), "cpus": os.cpu_count()}
    if details:
        report["cases"] = records
    return report


def _report(
    outcomes: dict[tuple[int, float], list[tuple[ExecTask, Outcome]]], config: ExecutedBenchConfig, model: str,
    valid: list[ExecTask], reference_fails: list[str], empty_passes: list[str], skipped_languages: dict[str, str],
    executor: Executor, seconds: float,
) -> dict[str, Any]:
    cells = {key: summarize([o for _, o in pairs]) for key, pairs in outcomes.items()}
    table = [{"k": k, "budget_s": b, **cell} for (k, b), cell in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0]))]
    sources = sorted({t.source for t in valid})
    by_source = {
        source: [
            {"k": k, "budget_s": b, **summarize([o for t, o in pairs if t.source == source])}
            for (k, b), pairs in sorted(outcomes.items(), key=lambda item: (item[0][1], item[0][0]))
        ]
        for source in sources
    }
    sample: dict[str, int] = {}
    for task in valid:
        sample[task.source] = sample.get(task.source, 0) + 1
    return {
        "table": table,
        "by_source": by_source,
        "goals": goals(cells),
        "meta": {
            "model": model,
            "tasks": len(valid),
            "sample": sample,
            "seed": config.seed,
            "request": request_options(config),
            "full": config.full,
            "ks": list(config.ks),
            "budgets_s": list(config.budgets_s),
            "max_tokens": config.max_tokens,
            "prompt": "warm (prefilled first, untimed)" if config.warm_prompt else "cold (prefix cache cleared before each request)",
            "reference_fails": reference_fails,
            "empty_hole_passes": empty_passes,
            "skipped_languages": skipped_languages,
            "sandbox": executor.sandbox.isolation.describe(),
            "sandbox_limits": {"timeout_s": config.limits.timeout_s, "memory_mb": config.limits.memory_mb,
                               "processes": config.limits.processes, "file_mb": config.limits.file_mb},  # fmt: skip
            "programs_run": executor.runs,
            "program_statuses": dict(sorted(executor.statuses.items())),
            "javascript_lodash": "a stand-in module: isEqual = util.isDeepStrictEqual (lodash is not installed)",
            "seconds": round(seconds, 1),
        },
    }


def plot_executed(report: dict[str, Any], path: str) -> str:
    """pass@first and pass@all against the time budget, one line per k, and the latency p50."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = report["table"]
    ks = sorted({row["k"] for row in table})
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for k in ks:
        rows = sorted((r for r in table if r["k"] == k), key=lambda r: r["budget_s"])
        budgets = [r["budget_s"] for r in rows]
        axes[0].plot(budgets, [r["pass_at_first"] for r in rows], marker="o", label=f"k = {k}")
        axes[1].plot(budgets, [r["pass_at_all"] for r in rows], marker="o", label=f"k = {k}")
        axes[2].plot(budgets, [r["latency_ms"]["p50"] / 1000 for r in rows], marker="o", label=f"k = {k} p50")
    axes[2].plot(budgets, budgets, linestyle=":", color="grey", label="budget")
    for ax, title in zip(axes, ("pass@first (top-ranked)", "pass@all (any of the k)", "latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("time budget per request (s)")
        ax.set_title(title)
        ax.legend()
    for ax in axes[:2]:
        ax.set_ylim(0, max(0.05, max((r["pass_at_all"] or 0) for r in table) * 1.15))
    meta = report["meta"]
    figure.suptitle(f"{meta['model'].split(' (')[0]}: {meta['tasks']} tasks, {meta['prompt'].split(' (')[0]} prompt")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def beside_peer(report: dict[str, Any], peer_report: dict[str, Any], file_name: str) -> dict[str, Any]:
    """kspec's table beside a peer's on the same tasks and budgets (`run_executed_bench` of an
    `InfillPeer`, k = 1: its one greedy answer): per budget kspec's pass@first / pass@all per k and
    the peer's pass@1, and the goal that kspec's first answer at k = 4 is not below the peer's."""
    peer_cells = {row["budget_s"]: row for row in peer_report["table"] if row["k"] == 1}
    versus: dict[str, Any] = {}
    for row in report["table"]:
        peer = peer_cells.get(row["budget_s"])
        if peer is None:
            continue
        cell = versus.setdefault(str(row["budget_s"]), {"peer_pass_at_1": peer["pass_at_first"], "peer_empty_rate": peer["empty_rate"],
                                                         "peer_latency_ms": peer["latency_ms"]})  # fmt: skip
        cell[f"k{row['k']}"] = {"pass_at_first": row["pass_at_first"], "pass_at_all": row["pass_at_all"], "empty_rate": row["empty_rate"]}
    one = versus.get("1.0", {})
    goals = dict(report.get("goals", {}))
    peer_first = one.get("peer_pass_at_1")
    for k in ("k4", "k1"):
        if k in one and peer_first is not None:
            first = one[k]["pass_at_first"]
            goals[f"pass_at_first_{k}_not_below_peer_at_1s"] = {k: first, "peer": peer_first, "met": first >= peer_first - EPSILON}
    peer_meta = {"model": peer_report["meta"]["model"], "file": file_name, "table": peer_report["table"]}
    return {**report, "goals": goals, "peer": peer_meta, "versus_peer": versus}
