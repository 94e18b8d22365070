"""`kspec bench clients`: what an editor that speaks plain LSP gets. A client with
no kspec extensions (it never re-asks on `$/kspec/suggestionsUpdated`: Neovim 0.12's built-in
inline completion, Emacs, Helix) asks `textDocument/inlineCompletion`, triggerKind Invoked, k = 4,
at fresh positions: the start of a HumanEval function's body, each in a document of its own.

Per position: the alternatives, how many are distinct (whitespace-normalised), how many are whole
(the function with the alternative in place still parses once an opened block gets a body: a
fragment such as `if self` or `node.` does not; a cut that happens to be valid Python, `return len`,
cannot be told from a whole line), and the latency. Reported: the share of positions with >= 2
distinct whole alternatives (the goal: >= 95 %), the share of alternatives that are fragments, and
the latency p50 / p95 against the deadline."""

from __future__ import annotations

import ast
import asyncio
import gzip
import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kspec.bench.crossfile_lsp import Editor
from kspec.bench.stats import percentile, rounded
from kspec.engine.syntax.rank import dedupe_key

HUMANEVAL = Path("human-eval") / "HumanEval.jsonl.gz"
BODY_INDENT = "    "
GOAL_SHARE = 0.95


@dataclass(frozen=True)
class ClientsConfig:
    data: Path  # the shared evaluation data (HumanEval)
    positions: int = 20
    k: int = 4
    deadline_ms: float = 3000.0  # the language server's default
    model: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.positions < 1 or self.k < 2:
            raise ValueError("kspec bench clients: --repeats (positions) must be >= 1 and k >= 2")
        if not (self.data / HUMANEVAL).exists():
            raise ValueError(f"kspec bench clients: {self.data / HUMANEVAL} is missing (--data: the shared evaluation data)")


def body_starts(config: ClientsConfig) -> list[tuple[str, str]]:
    """(task id, the function up to its body's first indent), a seeded sample."""
    with gzip.open(config.data / HUMANEVAL, "rt", encoding="utf-8") as lines:
        tasks = [json.loads(line) for line in lines if line.strip()]
    chosen = random.Random(config.seed).sample(tasks, min(config.positions, len(tasks)))
    return [(task["task_id"], task["prompt"].rstrip() + "\n" + BODY_INDENT) for task in chosen]


def is_whole(source: str, alternative: str) -> bool:
    """The function with `alternative` at its body's start parses (an opened block given a body)."""
    text = source + alternative
    last = text.rstrip("\n").split("\n")[-1]
    if last.rstrip().endswith(":"):
        indent = len(last) - len(last.lstrip())
        text = text.rstrip("\n") + "\n" + " " * (indent + 4) + "pass"
    try:
        ast.parse(text + "\n")
    except SyntaxError:
        return False
    return True


def score(source: str, alternatives: list[str]) -> dict[str, Any]:
    whole = [text for text in alternatives if is_whole(source, text)]
    return {
        "alternatives": len(alternatives),
        "distinct_whole": len({dedupe_key(text) for text in whole}),
        "fragments": len(alternatives) - len(whole),
    }


def summarise(rows: list[dict[str, Any]], deadline_ms: float) -> dict[str, Any]:
    latencies = [row["ms"] for row in rows]
    answered = sum(row["alternatives"] for row in rows)
    share = sum(row["distinct_whole"] >= 2 for row in rows) / len(rows)
    return {
        "positions": len(rows),
        "two_distinct_whole_share": round(share, 3),
        "goal_met": share >= GOAL_SHARE,
        "fragment_share": round(sum(row["fragments"] for row in rows) / answered, 3) if answered else None,
        "empty": sum(row["alternatives"] == 0 for row in rows),
        "latency_ms": {"p50": rounded(percentile(latencies, 50)), "p95": rounded(percentile(latencies, 95)), "deadline": deadline_ms},
        "within_deadline": sum(ms <= deadline_ms for ms in latencies),
    }


async def _run(config: ClientsConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    options: dict[str, Any] = {"k": config.k, "deadlineMs": config.deadline_ms, "debounceMs": 0, "contextFiles": False}
    if config.model:
        options["model"] = config.model
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kspec-clients-") as scratch:
        folder = Path(scratch)
        editor = Editor()
        try:
            await editor.start(folder, options, timeout_s=300)
            for task_id, source in body_starts(config):
                uri = (folder / (task_id.replace("/", "_") + ".py")).as_uri()
                editor.open(uri, source)
                lines = source.split("\n")
                texts, ms = await editor.inline(uri, len(lines) - 1, len(lines[-1]), timeout_s=60)
                editor.close(uri)
                rows.append({"task": task_id, "ms": round(ms, 1), "texts": texts, **score(source, texts)})
                progress(task_id)
        finally:
            await editor.stop()
    return {"summary": summarise(rows, config.deadline_ms), "rows": rows}


def run_clients_bench(config: ClientsConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    return asyncio.run(_run(config, progress))
