"""`kspec bench quality --cross-file`: does context beyond the window reach the model?

Holes come from real multi-module packages (the standard library's `email`, `json`,
`importlib`, `http`, `logging`, `concurrent`, `xml`, and click / jinja2 where installed), read at
run time and copied into a scratch workspace folder (so that `from email import utils` resolves
inside it, as in a checkout). A hole is a single-line statement inside a function whose text uses
`alias.name`, where `alias` is a sibling module of the same package and `name` is defined at the
top level of that sibling and appears nowhere in the file before the hole's line. Each hole is cut
twice: `line` (the cursor after the line's indentation) and `name` (the cursor where `name`
starts, after `alias.`); the reference is the rest of the line.

Each cut is asked through the real language server (`kspec lsp` over stdio, the engine in its
process) three ways, interleaved hole by hole (A B C, so all see the same machine noise):
  off     `contextFiles: false`: the window of the file alone (what kspec did before);
  closed  context on, only the hole's file open: imported definitions, read from the workspace;
  open    context on, the sibling module open in the editor too (its chunks ranked by similarity).
Each is a cold request at the hole (a new document), then a warm keystroke: the first character
of the reference typed, and the request at the new cursor (the prefix cache's case). Reported per
way: the share of cuts whose top suggestion / any of the k writes `name`, exact match of the top
one / any, cold and warm latency p50/p95, and the context the server reported (files, tokens).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kspec.bench.stats import percentile
from kspec.engine.syntax.rank import dedupe_key

WAYS = ("off", "closed", "open")
STDLIB_PACKAGES = ("email", "json", "importlib", "http", "logging", "concurrent", "xml", "urllib")
SITE_PACKAGES = ("click", "jinja2")
MIN_NAME = 4  # shorter names are guessed too easily to tell anything


@dataclass(frozen=True)
class CrossFileConfig:
    holes: int = 24
    k: int = 4
    max_tokens: int = 32
    deadline_ms: float = 20000.0
    seed: int = 41
    model: str | None = None
    prompt_tokens: int | None = None  # the engine's prompt budget (EngineConfig.prompt_tokens); None: the machine fit's
    start_timeout_s: float = 600.0
    packages: tuple[str, ...] = (*STDLIB_PACKAGES, *SITE_PACKAGES)  # importable packages the holes are cut from

    def __post_init__(self) -> None:
        if self.holes < 1 or not 1 <= self.k <= 32 or self.max_tokens < 1 or self.deadline_ms < 50:
            raise ValueError("holes >= 1, k in 1..32, max_tokens >= 1, deadline_ms >= 50")
        if not self.packages:
            raise ValueError("name at least one package to cut holes from")


@dataclass(frozen=True)
class Cut:
    package: str
    module: Path  # the hole's file, relative to the workspace folder
    sibling: Path  # the file defining `name`, relative to the workspace folder
    name: str
    kind: str  # "line" or "name"
    line: int  # 0-based
    column: int  # code points
    reference: str  # the rest of the line from the cursor


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if len(n) >= MIN_NAME}


def _sibling_aliases(tree: ast.Module, package: str, folder: Path) -> dict[str, Path]:
    """alias -> sibling module file, for `from . import x`, `from pkg import x`, `import pkg.x as y`."""
    found: dict[str, Path] = {}
    for node in tree.body:
        pairs: list[tuple[str, str]] = []
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == package) and node.module in (None, package):
            pairs = [(a.asname or a.name, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.asname, a.name.split(".", 1)[1]) for a in node.names if a.asname and a.name.startswith(package + ".")]
        for alias, module in pairs:
            path = folder / (module.replace(".", "/") + ".py")
            if path.is_file():
                found[alias] = path
    return found


def _cuts_of(module: Path, package: str, folder: Path, root: Path, defined: Callable[[Path], set[str]]) -> list[Cut]:
    """The cuts of `module` (in the package folder `folder`; paths relative to `root`)."""
    text = module.read_text(encoding="utf-8")
    tree = ast.parse(text)
    aliases = _sibling_aliases(tree, package, folder)
    lines = text.splitlines(keepends=True)
    cuts: list[Cut] = []
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for statement in function.body:
            if statement.lineno != statement.end_lineno or isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(statement):
                if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases):
                    continue
                sibling, name = aliases[node.value.id], node.attr
                before = "".join(lines[: statement.lineno - 1])
                if name not in defined(sibling) or re.search(rf"\b{re.escape(name)}\b", before):
                    continue
                row = lines[statement.lineno - 1].rstrip("\n")
                indent = len(row) - len(row.lstrip())
                at = node.value.end_col_offset + 1  # after `alias.` (ASCII sources: bytes = code points)
                for kind, column in (("line", indent), ("name", at)):
                    cuts.append(Cut(package, module.relative_to(root), sibling.relative_to(root), name, kind,
                                    statement.lineno - 1, column, row[column:]))  # fmt: skip
                break
    return cuts


def package_folders(names: tuple[str, ...] = (*STDLIB_PACKAGES, *SITE_PACKAGES)) -> list[tuple[str, Path]]:
    """(name, folder) of the packages `names` that are installed here (packages, not single modules)."""
    import importlib.util

    found = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.append((name, Path(list(spec.submodule_search_locations)[0])))
    return found


def find_cuts(packages: list[tuple[str, Path]], holes: int, rng: random.Random) -> list[Cut]:
    """Up to `holes` holes (two cuts each), spread over the packages, chosen by `rng`."""
    cache: dict[Path, set[str]] = {}

    def defined(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = _top_level_names(ast.parse(path.read_text(encoding="utf-8")))
        return cache[path]

    by_package: list[list[list[Cut]]] = []
    for package, folder in packages:
        found = []
        for module in sorted(folder.rglob("*.py")):
            if "test" in module.parts[-1] or "test" in str(module.relative_to(folder)):
                continue
            try:
                pairs = _cuts_of(module, package, module.parent, folder.parent, defined)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            found += [pairs[i : i + 2] for i in range(0, len(pairs), 2)]
        rng.shuffle(found)
        by_package.append(found)
    chosen: list[Cut] = []
    while len(chosen) < holes * 2 and any(by_package):
        for found in by_package:  # round robin: no package dominates
            if found and len(chosen) < holes * 2:
                chosen += found.pop()
    return chosen


def cut_flags(name: str, reference: str, texts: list[str]) -> dict[str, bool]:
    """What the suggestions of one cut count for: the name or the reference's line, exactly, in
    the first line of the top one or of any (the rest of a suggestion is not the hole's line)."""
    writes = [bool(re.search(rf"\b{re.escape(name)}\b", t.split("\n", 1)[0])) for t in texts]
    exact = [dedupe_key(t.split("\n", 1)[0]) == dedupe_key(reference) for t in texts]
    return {"empty": not texts, "name_top1": bool(writes and writes[0]), "name_any": any(writes),
            "exact_top1": bool(exact and exact[0]), "exact_any": any(exact)}  # fmt: skip


@dataclass
class Tally:
    cuts: int = 0
    name_top1: int = 0
    name_any: int = 0
    exact_top1: int = 0
    exact_any: int = 0
    empty: int = 0
    cold_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    context_files: list[int] = field(default_factory=list)
    # per cut, None where the status told no prompt: the warm keystroke's prefill (`prompt.prefillMs`)
    # and its prompt tokens the prefix cache did not hold
    warm_prefill_ms: list[float | None] = field(default_factory=list)
    warm_uncached: list[int | None] = field(default_factory=list)
    flags: list[dict[str, bool]] = field(default_factory=list)  # per cut: the counters' terms
    shown: list[list[str]] = field(default_factory=list)  # per cut: the first line of each suggestion

    def add(self, cut: Cut, texts: list[str], cold_ms: float, warm_ms: float, context: dict[str, Any], warm_prompt: dict[str, Any] | None = None) -> None:
        self.shown.append([t.split("\n", 1)[0] for t in texts])
        self.count(cut_flags(cut.name, cut.reference, texts), cold_ms, warm_ms)
        self.context_tokens.append(int(context.get("tokens", 0)))
        self.context_files.append(len(context.get("files", [])))
        prompt = warm_prompt or {}
        told = "prefillMs" in prompt
        self.warm_prefill_ms.append(float(prompt["prefillMs"]) if told else None)
        self.warm_uncached.append(int(prompt.get("tokens", 0)) - int(prompt.get("reusedTokens", 0)) if told else None)

    def count(self, flags: dict[str, bool], cold_ms: float, warm_ms: float) -> None:
        """One cut's counters' terms (`cut_flags`) and latencies."""
        self.flags.append(flags)
        self.cuts += 1
        for name, value in flags.items():
            setattr(self, name, getattr(self, name) + value)
        self.cold_ms.append(cold_ms)
        self.warm_ms.append(warm_ms)

    def summary(self) -> dict[str, Any]:
        share = lambda n: round(n / self.cuts, 3) if self.cuts else None  # noqa: E731
        ms = lambda xs, q: round(percentile(xs, q), 1) if xs else None  # noqa: E731
        prefills = [x for x in self.warm_prefill_ms if x is not None]
        uncached = [x for x in self.warm_uncached if x is not None]
        return {
            "cuts": self.cuts, "name_top1": share(self.name_top1), "name_any_of_k": share(self.name_any),
            "exact_top1": share(self.exact_top1), "exact_any_of_k": share(self.exact_any), "empty": share(self.empty),
            "cold_p50_ms": ms(self.cold_ms, 50), "cold_p95_ms": ms(self.cold_ms, 95),
            "warm_p50_ms": ms(self.warm_ms, 50), "warm_p95_ms": ms(self.warm_ms, 95),
            "context_tokens_mean": round(sum(self.context_tokens) / self.cuts, 1) if self.cuts else None,
            "context_files_mean": round(sum(self.context_files) / self.cuts, 2) if self.cuts else None,
            # where a warm keystroke's time goes: its prefill (the prompt from the prefix cache but
            # for the tokens it did not hold) — the rest is decoding what the branches write
            "warm_prefill_p50_ms": ms(prefills, 50), "warm_prefill_p95_ms": ms(prefills, 95),
            "warm_uncached_tokens_max": max(uncached) if uncached else None,
        }  # fmt: skip


POOLED_FIELDS = ("cuts", "name_top1", "name_any_of_k", "exact_top1", "exact_any_of_k", "empty",
                 "cold_p50_ms", "cold_p95_ms", "warm_p50_ms", "warm_p95_ms")  # fmt: skip


def pool_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' reports (`--cross-file --json`) as one: per kind of cut and way, the shares
    and latency percentiles over all their cuts (a p95 of one run's 44 keystrokes moves by
    0.2-0.4 between runs); per run, its prompt budget and holes."""
    tallies = {kind: {way: Tally() for way in WAYS} for kind in ("all", "line", "name")}
    runs = []
    for report in reports:
        if "cases" not in report or any("ms" not in case for case in report["cases"]):
            raise ValueError("a report without per-cut latencies (`ms`; an older kspec's): run the bench again")
        runs.append({"prompt_tokens": (report.get("machine_defaults") or {}).get("promptTokens"), **report["config"]})
        for case in report["cases"]:
            for way in WAYS:
                flags = cut_flags(case["name"], case["reference"], case[way])
                for kind in ("all", case["kind"]):
                    tallies[kind][way].count(flags, *case["ms"][way])
    pooled: dict[str, Any] = {"runs": runs}
    for kind, ways in tallies.items():
        summaries = {way: tally.summary() for way, tally in ways.items()}
        pooled[kind] = {way: {name: summary[name] for name in POOLED_FIELDS} for way, summary in summaries.items()}
    off, opened = pooled["all"]["off"]["warm_p95_ms"], pooled["all"]["open"]["warm_p95_ms"]
    if off and opened:
        pooled["warm_p95_open_over_off"] = round(opened / off, 3)
    return pooled
