"""`kspec bench quality --execute`: tasks and their programs, the pass@ arithmetic, the goals,
the run loop (a scripted engine: which requests it gets), and one small run on the embedded model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kspec.bench.executed import (
    ExecTask, ExecutedBenchConfig, Executor, Outcome, goals, load_tasks, run_executed_bench, summarize,
)
from kspec.bench.sandbox import Sandbox, SandboxLimits, find_runtime
from kspec.engine.api import Completion, CompletionRequest, CompletionResult

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not found at {DATA}")
needs_node = pytest.mark.skipif(find_runtime("node") is None, reason="node is not installed")
TINY = ExecutedBenchConfig(humaneval_single=1, humaneval_multi=1, mbxp_per_language=1, ks=(1, 2), budgets_s=(0.5, 4.0))


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(timeout_s=10))


# ------------------------------------------------------------------------- pass@ arithmetic

def test_pass_at_first_and_at_all() -> None:
    outcomes = [
        Outcome((True, False), 100.0),  # the top one passes
        Outcome((False, False, True), 200.0),  # only the third
        Outcome((), 300.0),  # nothing came back
        Outcome((False,), 400.0),
    ]
    cell = summarize(outcomes)
    assert cell["tasks"] == 4
    assert cell["pass_at_first"] == 0.25
    assert cell["pass_at_all"] == 0.5
    assert cell["empty_rate"] == 0.25
    assert cell["alternatives_mean"] == 1.5
    assert cell["latency_ms"] == {"p50": 250.0, "p95": 385.0, "max": 400.0}
    assert not Outcome((), 1.0).first and not Outcome((), 1.0).any
    assert summarize([])["pass_at_first"] is None


def test_goals_compare_the_cells_the_issue_names() -> None:
    def cell(first: float, every: float) -> dict:
        return {"pass_at_first": first, "pass_at_all": every}

    cells = {(1, 0.5): cell(0.1, 0.1), (1, 1.0): cell(0.2, 0.2), (1, 2.0): cell(0.3, 0.3),
             (4, 0.5): cell(0.1, 0.35), (4, 1.0): cell(0.15, 0.3), (4, 2.0): cell(0.3, 0.5)}  # fmt: skip
    result = goals(cells)
    assert result["pass_at_all_k4_over_pass_at_first_k1_at_1s"]["met"] is True  # 0.3 >= 1.5 * 0.2
    assert result["pass_at_first_k4_not_below_k1"]["met"] is False  # 0.15 < 0.2 at 1 s
    assert result["pass_at_all_k4_at_0.5s_vs_pass_at_first_k1_at_2s"]["met"] is True  # 0.35 >= 0.3
    cells[(4, 1.0)] = cell(0.2, 0.29)
    result = goals(cells)
    assert result["pass_at_all_k4_over_pass_at_first_k1_at_1s"]["met"] is False
    assert result["pass_at_first_k4_not_below_k1"]["met"] is True
    assert goals({(8, 1.0): cell(0.5, 0.5)}) == {}  # nothing to compare


def test_config_is_validated() -> None:
    for bad in ({"ks": ()}, {"ks": (0,)}, {"budgets_s": (0.0,)}, {"max_tokens": 0}, {"humaneval_single": -1}, {"mbxp_languages": ("cobol",)}):
        with pytest.raises(ValueError):
            ExecutedBenchConfig(**bad)


# ------------------------------------------------------------------------- tasks and programs

@needs_data
def test_tasks_are_seeded_and_sized() -> None:
    config = ExecutedBenchConfig(humaneval_single=3, humaneval_multi=2, mbxp_per_language=2)
    tasks, skipped = load_tasks(DATA, config)
    assert [t.id for t in tasks] == [t.id for t in load_tasks(DATA, config)[0]]
    other, _ = load_tasks(DATA, ExecutedBenchConfig(humaneval_single=3, humaneval_multi=2, mbxp_per_language=2, seed=1))
    assert [t.id for t in other] != [t.id for t in tasks]
    by_source = {s: sum(t.source == s for t in tasks) for s in {t.source for t in tasks}}
    expected = {"humaneval-single": 3, "humaneval-multi": 2, "mbxp-python": 2}
    if "javascript" not in skipped:
        expected["mbxp-javascript"] = 2
    assert by_source == expected
    for task in tasks:
        assert task.reference.strip() and task.test.strip() and task.entry_point
        if task.source.startswith("mbxp"):
            assert "\n" not in task.reference  # one line, or the rest of one
    languages = ExecutedBenchConfig(mbxp_languages=("typescript", "java"), humaneval_single=0, humaneval_multi=0)
    none, reasons = load_tasks(DATA, languages)
    assert none == [] and set(reasons) == {"typescript", "java"}


@needs_data
def test_reference_programs_pass_and_wrong_fillings_fail(sandbox: Sandbox) -> None:
    tasks, _ = load_tasks(DATA, ExecutedBenchConfig(humaneval_single=4, humaneval_multi=4, mbxp_per_language=0))
    executor = Executor(sandbox)
    for task in tasks:
        assert executor.passes(task, task.reference), task.id
        assert task.program(task.reference) == task.prefix + task.reference + task.suffix + f"\n\n{task.test}\n\ncheck({task.entry_point})\n"
    one = next(t for t in tasks if t.source == "humaneval-single")
    assert not executor.passes(one, "    raise SystemExit(1)\n" + one.reference)
    assert executor.runs == len(tasks) + 1
    assert executor.passes(one, one.reference) and executor.runs == len(tasks) + 1  # each (task, text) runs once


@needs_data
@needs_node
def test_javascript_tasks_run_under_node_with_the_lodash_stand_in(sandbox: Sandbox) -> None:
    tasks, _ = load_tasks(DATA, ExecutedBenchConfig(humaneval_single=0, humaneval_multi=0, mbxp_per_language=6, mbxp_languages=("javascript",)))
    assert tasks and all(t.command()[0] == "node" for t in tasks)
    executor = Executor(sandbox)
    passing = [t for t in tasks if executor.passes(t, t.reference)]
    assert len(passing) >= len(tasks) // 2  # some MBJSP references fail their own tests; most pass
    for task in passing:
        assert "require(\"lodash\")" in task.test or "require('lodash')" in task.test
        assert not executor.passes(task, "throw new Error('wrong');")


# ------------------------------------------------------------------------- the run loop

class ScriptedEngine:
    """Answers every request with a wrong text then the reference: passes at all, not first."""

    model_name = "scripted"

    def __init__(self, references: dict[str, str]) -> None:
        self.references = references
        self.requests: list[CompletionRequest] = []
        self.clears = 0

    def complete(self, request: CompletionRequest) -> CompletionResult:
        self.requests.append(request)
        texts = ["raise SystemExit(1)\n" if request.language == "python" else "throw new Error('x');", self.references[request.request_id]]
        return CompletionResult([Completion(t, 0.0) for t in texts[: request.k]], self.model_name)

    def clear_caches(self) -> None:
        self.clears += 1


@needs_data
def test_every_task_k_and_budget_is_one_request_with_that_deadline(sandbox: Sandbox) -> None:
    tasks, _ = load_tasks(DATA, TINY)
    engine = ScriptedEngine({t.id: t.reference for t in tasks})
    report = run_executed_bench(engine, DATA, TINY, sandbox=sandbox, details=True)
    valid = report["meta"]["tasks"]
    assert valid >= 2
    timed = engine.requests[1:]  # the first is the untimed warm-up
    assert len(timed) == valid * 2 * 2 == engine.clears  # cold: caches cleared before each
    assert sorted({(r.k, r.deadline_ms) for r in timed}) == [(1, 500.0), (1, 4000.0), (2, 500.0), (2, 4000.0)]
    assert not any(r.raw for r in timed)  # trimmed and ranked, as an editor gets them
    table = {(row["k"], row["budget_s"]): row for row in report["table"]}
    for budget in TINY.budgets_s:
        assert table[(1, budget)]["pass_at_first"] == table[(1, budget)]["pass_at_all"] == 0.0
        assert table[(2, budget)]["pass_at_first"] == 0.0
        assert table[(2, budget)]["pass_at_all"] == 1.0
    assert len(report["cases"]) == len(timed)
    assert report["goals"] == {}  # no k = 4 in this table
    assert set(report["by_source"]) <= {"humaneval-single", "humaneval-multi", "mbxp-python", "mbxp-javascript"}


@needs_data
def test_a_small_run_on_the_embedded_model(default_engine, sandbox: Sandbox, tmp_path: Path) -> None:
    """Real generations, really executed: the figures agree with the cases they come from."""
    config = ExecutedBenchConfig(humaneval_single=1, humaneval_multi=1, mbxp_per_language=0, ks=(1, 2), budgets_s=(0.25, 1.0),
                                 max_tokens=16)  # fmt: skip
    report = run_executed_bench(default_engine, DATA, config, sandbox=sandbox, details=True)
    assert report["meta"]["model"] == default_engine.model_name
    assert report["meta"]["programs_run"] >= report["meta"]["tasks"] * 2  # each reference, each empty hole
    for row in report["table"]:
        cases = [c for c in report["cases"] if c["k"] == row["k"] and c["budget_s"] == row["budget_s"]]
        assert row["tasks"] == len(cases) == report["meta"]["tasks"]
        assert row["pass_at_first"] == round(sum(bool(c["passed"]) and c["passed"][0] for c in cases) / len(cases), 4)
        assert row["pass_at_all"] == round(sum(any(c["passed"]) for c in cases) / len(cases), 4)
        assert all(len(c["texts"]) <= row["k"] for c in cases)
    pytest.importorskip("matplotlib")
    from kspec.bench.executed import plot_executed

    assert Path(plot_executed(report, str(tmp_path / "table.png"))).stat().st_size > 0


def test_command_line_usage_errors_exit_2_before_any_model_loads(capsys) -> None:
    import logging

    from kspec.cli.main import main

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)  # main() configures the root logger: put it back
    try:
        _usage_errors(main, capsys)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _usage_errors(main, capsys) -> None:

    assert main(["bench", "quality", "--execute", "--budgets", "0.5,soon"]) == 2
    assert main(["bench", "quality", "--execute", "--budgets", "0"]) == 2
    assert main(["bench", "quality", "--execute", "--ks", "0,4"]) == 2
    assert main(["bench", "quality", "--execute", "--replay", "cases.json"]) == 2
    assert main(["bench", "quality", "--execute", "--data", "/nowhere/at/all"]) == 1
    assert "evaluation data folder not found" in capsys.readouterr().err


def test_kspec_beside_the_peer_per_budget() -> None:
    from kspec.bench.executed import beside_peer

    def table(rows: list[tuple[int, float, float, float]]) -> dict:
        return {"table": [{"k": k, "budget_s": b, "pass_at_first": f, "pass_at_all": a, "empty_rate": 0.0, "latency_ms": {}} for k, b, f, a in rows],
                "goals": {}, "meta": {"model": "m"}}

    ours = table([(1, 1.0, 0.4, 0.4), (4, 1.0, 0.5, 0.7), (4, 0.5, 0.3, 0.5)])
    theirs = table([(1, 1.0, 0.45, 0.45), (1, 0.5, 0.2, 0.2)])
    both = beside_peer(ours, theirs, "q.gguf")
    assert both["versus_peer"]["1.0"]["peer_pass_at_1"] == 0.45 and both["versus_peer"]["1.0"]["k4"]["pass_at_all"] == 0.7
    assert both["goals"]["pass_at_first_k4_not_below_peer_at_1s"]["met"] is True
    assert both["goals"]["pass_at_first_k1_not_below_peer_at_1s"]["met"] is False
    assert both["versus_peer"]["0.5"] == {"peer_pass_at_1": 0.2, "peer_empty_rate": 0.0, "peer_latency_ms": {}, "k4": {"pass_at_first": 0.3, "pass_at_all": 0.5, "empty_rate": 0.0}}


@needs_data
def test_the_branch_choice_reaches_every_timed_request(sandbox: Sandbox) -> None:
    """--others-temperature / --top-p / --seed: the same tasks asked with another branch choice."""
    config = dataclasses.replace(TINY, budgets_s=(4.0,), others_temperature=0.7, top_p=0.9, request_seed=3)
    tasks, _ = load_tasks(DATA, config)
    engine = ScriptedEngine({t.id: t.reference for t in tasks})
    report = run_executed_bench(engine, DATA, config, sandbox=sandbox)
    timed = engine.requests[1:]
    assert timed and {(r.others_temperature, r.top_p, r.seed) for r in timed} == {(0.7, 0.9, 3)}
    assert report["meta"]["request"] == {"others_temperature": 0.7, "top_p": 0.9, "seed": 3}
    engine = ScriptedEngine({t.id: t.reference for t in tasks})
    run_executed_bench(engine, DATA, TINY, sandbox=sandbox)
    assert {r.others_temperature for r in engine.requests[1:]} == {CompletionRequest("").others_temperature}  # the default
