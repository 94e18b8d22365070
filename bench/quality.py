"""`kspec bench quality`: what trimming, checking and ranking do for the user, raw vs trimmed,
with the whole file around the cursor and with a window of it.

Holes are cut from ../shared/data (read-only; never copied into the repo):
* Python: HumanEval-infilling SingleLine and MultiLine tasks as given (prefix = `prompt`,
  reference = `canonical_solution`, suffix = `suffix`; the cursor is at column 1);
* Java, JavaScript, TypeScript, C++: MBXP reference solutions (`prompt` +
  `canonical_solution`); one line of the solution is picked, and the hole is either the
  whole line with the cursor after its indentation, or the rest of the line from a token
  boundary (mid-line). Lines that are only punctuation (`}`, `});`) are not picked, nor
  solutions that do not parse (several MBTSP "TypeScript" solutions are Java);
* Python from real multi-function files: modules of the standard library of the Python
  running the bench, read from disk at run time (6-40 kB files with at least 4 functions);
  one single-line statement inside a function body, at least `STDLIB_MIN_LINE` lines down
  the file (so names defined far above the cursor matter), cut like an MBXP line.

The sample is small on purpose (a CPU run on 2 cores must finish within the hour): by
default 10 SingleLine + 10 MultiLine Python tasks, 5 holes per MBXP language and 16
standard-library holes, 56 cases (112 completions with the windowed variant), chosen with a
seeded RNG (`QualityBenchConfig.seed`), so every run sees the same cases. `--cases-out`
keeps them, and `--replay` post-processes them again without the model.

Each hole is completed twice, once with the whole file as prefix/suffix ("whole") and once
with a window of it ("windowed"): the window keeps a seeded random number of characters
before the cursor (up to `window_before`, 6000 like the language server) and after it (up to
`window_after`, 2000), so it starts and ends anywhere: inside a string, a comment, a
bracket, a statement (`meta.window_starts` counts where). Both are judged on the whole file.

Each completion is asked for with `raw=True` (untrimmed alternatives, distinct text as on
every surface); the trimmed+ranked list is `rank_alternatives` applied to those same
alternatives, so both columns judge the same generations. (Branches that wrote the very
same text therefore count once in the ranking's agreement here; live, post-processing sees
every branch.) Figures per column:
* `parse_break_rate`: share of shown suggestions after which the file does not parse.
  Python: `ast.parse` of prefix + suggestion + suffix (CPython is the oracle). Other
  languages: any tree-sitter ERROR/MISSING node in that file. Either way the file with the
  reference in the hole parses (holes where it does not are skipped), so a suggestion that
  leaves the hole unfilled (a header without its body) counts as breaking it.
* `no_suggestion_rate_raw_parses`: share of holes with nothing shown among those whose raw
  top-1 parses in the whole file (as written, or cut at one of its line ends: the model
  wrote a right unit and went on); `no_suggestion_rate`: the same over all holes.
* `python_top1_static_error_rate`: share of top-1 Python suggestions that introduce an
  undefined name or an unused variable (tree-sitter scopes, names the reference also gets
  flagged for excluded); `..._pyflakes`: the same by pyflakes, over top-1s that parse
  (whole-file messages the reference file does not get, about names the suggestion writes;
  a name the hole should have defined and did not is the suffix's error, not counted).
* `exact_match_top1` / `exact_match_best_of_k`: whitespace-normalised equality with the
  reference; `best_of_k_over_top1` their ratio (1.0: the right answer, when shown, is first).
* `distinct_rate`: share of answers whose alternatives are all different after the
  deduplication's normalisation (`dedupe_key`).
* `postprocess_ms`: time of `rank_alternatives` per request (min of 3 runs per case, then
  p50/p90/p95 over cases) for the k alternatives the engine returned, and for 8 alternatives
  (the engine's k plus truncated variants of them, so that every request has 8 distinct
  texts to trim, check and rank). Each run starts with the per-request memos empty
  (`forget_requests`), as the final answer to a new keystroke does when no interim answer
  came first: the window analysis, the baseline parse and every check are in the time.
  `k8_cpu_*`: the same runs in CPU time of the thread (steadier than wall time on a
  machine other work shares).

With `details`, the report keeps every case (what the engine saw, its raw alternatives,
what was shown): `replay_quality_bench` recomputes every figure from them without the model
(raw generation does not depend on post-processing, so a ranking change can be measured on
the same generations).
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import re
import statistics
import sys
import sysconfig
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from pyflakes import checker as pyflakes_checker
from pyflakes import messages as pyflakes_messages

from kspec.bench.stats import percentile, rounded
from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.engine.syntax import Checker, forget_requests, rank_alternatives
from kspec.engine.syntax.checks import python_parses
from kspec.engine.syntax.hole_errors import error_nodes
from kspec.engine.syntax.languages import SPECS, new_parser
from kspec.engine.syntax.lexer import lex, unmatched_openers
from kspec.engine.syntax.pynames import outside_names
from kspec.engine.syntax.rank import dedupe_key
from kspec.engine.syntax.window import MAX_AFTER, MAX_BEFORE

MBXP_FILES = {
    "java": "mbjp_release_v1.2.jsonl.gz",
    "javascript": "mbjsp_release_v1.2.jsonl.gz",
    "typescript": "mbtsp_release_v1.2.jsonl.gz",
    "cpp": "mbcpp_release_v1.2.jsonl.gz",
}
HUMANEVAL_FILES = {
    "humaneval-single": "HumanEval-SingleLineInfilling.jsonl.gz",
    "humaneval-multi": "HumanEval-MultiLineInfilling.jsonl.gz",
}
_BOUNDARY_CHARS = set(" (,=[{+-*/<>!&|:?")
STDLIB_SIZES = (6_000, 40_000)  # characters of a standard-library module worth a hole
STDLIB_MIN_FUNCTIONS = 4
STDLIB_MIN_LINE = 40  # holes sit at least this far down the file
VARIANTS = ("whole", "windowed")


class CompletesRequests(Protocol):
    model_name: str

    def complete(self, request: CompletionRequest) -> CompletionResult: ...


@dataclass(frozen=True)
class QualityBenchConfig:
    humaneval_single: int = 10
    humaneval_multi: int = 10
    mbxp_per_language: int = 5
    stdlib: int = 16  # holes in modules of this Python's standard library
    k: int = 4
    max_tokens: int = 48
    seed: int = 0
    deadline_ms: float = 120_000.0  # generous: the figures are about quality, not latency
    timing_repeats: int = 3
    timing_k: int = 8
    windowed: bool = True  # also complete every hole from a window of its file
    window_before: int = MAX_BEFORE  # at most this many characters before the cursor (as the language server)
    window_after: int = MAX_AFTER
    # the requests' branch choice (CompletionRequest): None keeps the request's default
    others_temperature: float | None = None
    top_p: float = 1.0
    request_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("humaneval_single", "humaneval_multi", "mbxp_per_language", "stdlib"):
            if getattr(self, name) < 0:
                raise ValueError(f"QualityBenchConfig.{name} must be >= 0")
        for name in ("k", "max_tokens", "timing_repeats", "timing_k", "window_before"):
            if getattr(self, name) < 1:
                raise ValueError(f"QualityBenchConfig.{name} must be >= 1")
        if self.window_after < 0:
            raise ValueError("QualityBenchConfig.window_after must be >= 0")
        if self.deadline_ms <= 0:
            raise ValueError("QualityBenchConfig.deadline_ms must be > 0")


@dataclass(frozen=True)
class Hole:
    id: str
    source: str  # humaneval-single, humaneval-multi, mbxp-java, ..., stdlib
    language: str
    prefix: str
    suffix: str
    reference: str
    kind: str  # "given" (HumanEval), "line" or "mid-line" (MBXP, stdlib)


@dataclass(frozen=True)
class Window:
    """What the engine sees of a hole's file: `prefix` ends and `suffix` starts at the cursor."""

    prefix: str
    suffix: str
    starts_in: str  # where the window's first character is: code, line-start, string, comment, bracket
    ends_in: str  # the same for the character after its last one ("end": the file's end)
    outside_names: tuple[str, ...] = ()  # Python: what the file binds outside it, as the language server sends it


def window_of(hole: Hole, start: int, end: int, starts_in: str, ends_in: str) -> Window:
    """The window (hole.prefix + hole.suffix)[start:end] around the hole's cursor."""
    text = hole.prefix + hole.suffix
    outside = outside_names(text, start, end) if hole.language == "python" else ()
    return Window(text[start : len(hole.prefix)], text[len(hole.prefix) : end], starts_in, ends_in, outside)


def request_options(config: Any) -> dict[str, Any]:
    """A bench config's branch choice (`others_temperature`, `top_p`, `request_seed`) as
    CompletionRequest fields; an `others_temperature` of None leaves the request's default."""
    options: dict[str, Any] = {"top_p": config.top_p, "seed": config.request_seed}
    if config.others_temperature is not None:
        options["others_temperature"] = config.others_temperature
    return options


# ------------------------------------------------------------------------------ cutting holes

def _read_jsonl_gz(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def humaneval_holes(data_dir: Path, source: str, count: int, rng: random.Random) -> list[Hole]:
    rows = _read_jsonl_gz(data_dir / "human-eval-infilling" / HUMANEVAL_FILES[source])
    chosen = rng.sample(rows, min(count, len(rows)))
    return [
        Hole(row["task_id"], source, "python", row["prompt"], row["suffix"], row["canonical_solution"], "given")
        for row in chosen
    ]


def _pickable(line: str) -> bool:
    content = line.strip()
    return sum(c.isalnum() for c in content) >= 3 and not content.startswith(("//", "/*", "*", "#"))


def _line_spans(text: str, start: int) -> list[tuple[int, int]]:
    spans = []
    pos = start
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        spans.append((pos, end))
        pos = end + 1
    return spans


def cut_line_hole(task_id: str, source: str, language: str, text: str, start: int, rng: random.Random) -> Hole | None:
    """A hole in one line of `text` (a line of the reference solution starting at `start`)."""
    candidates = [span for span in _line_spans(text, start) if _pickable(text[span[0] : span[1]])]
    if not candidates:
        return None
    return _cut_in_line(task_id, source, language, text, rng.choice(candidates), rng)


def _cut_in_line(
    task_id: str, source: str, language: str, text: str, span: tuple[int, int], rng: random.Random
) -> Hole:
    """The hole is the line from its indentation, or half the time from a token boundary on."""
    line_start, line_end = span
    line = text[line_start:line_end]
    content_start = line_start + len(line) - len(line.lstrip())
    cut = content_start
    kind = "line"
    if rng.random() < 0.5:
        boundaries = [
            i for i in range(content_start + 1, line_end - 1)
            if text[i - 1] in _BOUNDARY_CHARS and text[i:line_end].strip() and text[content_start:i].strip()
        ]
        if boundaries:
            cut, kind = rng.choice(boundaries), "mid-line"
    reference = text[cut:line_end]
    return Hole(f"{task_id}:{kind}@{cut}", source, language, text[:cut], text[line_end:], reference, kind)


def _has_error_nodes(text: str, language: str) -> bool:
    root = new_parser(language).parse(text.encode("utf-8", "surrogatepass")).root_node
    return bool(error_nodes(root))


def mbxp_holes(data_dir: Path, language: str, count: int, rng: random.Random) -> list[Hole]:
    """Holes in MBXP reference solutions that parse (some MBTSP ones are not TypeScript)."""
    rows = [r for r in _read_jsonl_gz(data_dir / "mbxp" / MBXP_FILES[language]) if r.get("canonical_solution")]
    holes: list[Hole] = []
    for row in rng.sample(rows, len(rows)):
        if len(holes) >= count:
            break
        if _has_error_nodes(row["prompt"] + row["canonical_solution"], language):
            continue
        hole = cut_line_hole(
            row["task_id"], f"mbxp-{language}", language, row["prompt"] + row["canonical_solution"],
            len(row["prompt"]), rng,
        )
        if hole is not None:
            holes.append(hole)
    return holes


def stdlib_modules(root: Path | None = None) -> list[Path]:
    """Standard-library modules of the running Python fit for holes: a real file of several
    functions, sorted by name (the seeded sample depends only on this list)."""
    folder = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    low, high = STDLIB_SIZES
    return sorted(p for p in folder.glob("*.py") if p.is_file() and low <= p.stat().st_size <= high)


def _statement_lines(tree: ast.Module) -> list[int]:
    """1-based lines holding a whole one-line statement inside a function body (no docstring)."""
    lines = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.stmt) or node is function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.end_lineno != node.lineno or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
                continue
            if not isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):  # one-line compound ones are rare
                lines.append(node.lineno)
    return sorted(set(lines))


def stdlib_holes(count: int, rng: random.Random, root: Path | None = None) -> list[Hole]:
    """Holes in single-line statements of functions of standard-library modules (read from disk)."""
    holes: list[Hole] = []
    modules = stdlib_modules(root)
    for path in rng.sample(modules, len(modules)):
        if len(holes) >= count:
            break
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree)) < STDLIB_MIN_FUNCTIONS:
            continue
        spans = _line_spans(text, 0)
        lines = [n for n in _statement_lines(tree) if n > STDLIB_MIN_LINE and _pickable(text[slice(*spans[n - 1])])]
        if lines:
            holes.append(_cut_in_line(f"stdlib/{path.name}", "stdlib", "python", text, spans[rng.choice(lines) - 1], rng))
    return holes


def load_holes(data_dir: str | Path, config: QualityBenchConfig) -> list[Hole]:
    """The seeded sample of holes (same config, same holes)."""
    root = Path(data_dir)
    rng = random.Random(config.seed)
    holes = humaneval_holes(root, "humaneval-single", config.humaneval_single, rng)
    holes += humaneval_holes(root, "humaneval-multi", config.humaneval_multi, rng)
    for language in MBXP_FILES:
        holes += mbxp_holes(root, language, config.mbxp_per_language, rng)
    holes += stdlib_holes(config.stdlib, random.Random(f"{config.seed}-stdlib"))
    return holes


def _place(text: str, at: int, language: str) -> str:
    """Where offset `at` of a file is: inside a string or comment, a bracket, mid-line, or at a line start."""
    if at >= len(text):
        return "end"
    spec = SPECS[language]
    result = lex(text[:at], spec, newlines=False)
    if result.end_state is not None:
        return "comment" if "comment" in result.end_state.kind else "string"
    if unmatched_openers(result.tokens):
        return "bracket"
    return "line-start" if at == 0 or text[at - 1] == "\n" else "code"


def cut_window(hole: Hole, config: QualityBenchConfig) -> Window:
    """A seeded window around the hole's cursor, cut anywhere (the same for the same hole and seed)."""
    rng = random.Random(f"{config.seed}-window-{hole.id}")
    before = rng.randint(min(len(hole.prefix), 60), min(len(hole.prefix), config.window_before))
    after = rng.randint(0, min(len(hole.suffix), config.window_after))
    text = hole.prefix + hole.suffix
    start, end = len(hole.prefix) - before, len(hole.prefix) + after
    return window_of(hole, start, end, _place(text, start, hole.language), _place(text, end, hole.language))


# ------------------------------------------------------------------------------- judging

_FLAKES = (pyflakes_messages.UndefinedName, pyflakes_messages.UnusedVariable)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def pyflakes_names(source: str) -> set[tuple[str, str]]:
    report = pyflakes_checker.Checker(ast.parse(source), filename="hole.py")
    return {(type(m).__name__, str(m.message_args[0])) for m in report.messages if isinstance(m, _FLAKES)}


class Judge:
    """Everything about one hole that is the same for every suggestion (judged on the whole file)."""

    def __init__(self, hole: Hole) -> None:
        self.hole = hole
        self.python = hole.language == "python"
        self.checker = Checker(hole.prefix, hole.suffix, hole.language)
        reference_file = hole.prefix + hole.reference + hole.suffix
        if self.python:
            self.valid = python_parses(reference_file)
            self.reference_flakes = pyflakes_names(reference_file) if self.valid else set()
            reference_check = self.checker.check(hole.reference)
            self.reference_names = set(reference_check.undefined_names) | set(reference_check.unused_variables)
        else:
            self.valid = not _has_error_nodes(reference_file, hole.language)

    def breaks_parse(self, text: str) -> bool:
        """Whether the file with `text` in the hole does not parse (the reference's does)."""
        source = self.hole.prefix + text + self.hole.suffix
        if self.python:
            return not python_parses(source)
        return _has_error_nodes(source, self.hole.language)

    def raw_parses(self, text: str) -> bool:
        """Whether `text`, as written or cut at one of its line ends, leaves the file parsing."""
        ends = [m.start() for m in re.finditer("\n", text)] + [len(text)]
        return any(text[:end].strip() and not self.breaks_parse(text[:end]) for end in ends)

    def static_error(self, text: str) -> bool:
        """An undefined name or unused variable the reference does not have (tree-sitter scopes)."""
        check = self.checker.check(text)
        return bool((set(check.undefined_names) | set(check.unused_variables)) - self.reference_names)

    def static_error_pyflakes(self, text: str) -> bool | None:
        """The same by pyflakes (messages about names the suggestion writes, that the file with
        the reference does not get); None when the file does not parse."""
        source = self.hole.prefix + text + self.hole.suffix
        if not python_parses(source):
            return None
        written = set(_IDENTIFIER.findall(text))
        return any(name in written for _, name in pyflakes_names(source) - self.reference_flakes)

    def undefined_name(self, text: str) -> bool:
        """An undefined name the reference does not have (tree-sitter scopes; unused variables aside)."""
        return bool(set(self.checker.check(text).undefined_names) - self.reference_names)

    def exact(self, text: str) -> bool:
        return dedupe_key(text) == dedupe_key(self.hole.reference)


@dataclass
class Column:
    """Running totals for one column (raw or trimmed) of one variant (whole or windowed)."""

    cases: int = 0
    shown: int = 0
    breaks: int = 0
    cases_with_suggestion: int = 0
    cases_distinct: int = 0
    raw_parses: int = 0  # holes whose raw top-1 parses in the whole file
    raw_parses_nothing_shown: int = 0
    exact_top1: int = 0
    exact_any: int = 0
    python_top1: int = 0
    python_top1_static: int = 0
    python_top1_undefined: int = 0
    python_top1_pyflakes_judged: int = 0
    python_top1_pyflakes_static: int = 0
    postprocess_ms: list[float] = field(default_factory=list)
    postprocess_k8_ms: list[float] = field(default_factory=list)
    postprocess_k8_cpu_ms: list[float] = field(default_factory=list)
    by_language: dict[str, list[int]] = field(default_factory=dict)  # language -> [shown, breaks]

    def add(self, judge: Judge, texts: list[str], raw_top1_parses: bool) -> None:
        language = judge.hole.language
        per_language = self.by_language.setdefault(language, [0, 0])
        breaks = sum(judge.breaks_parse(t) for t in texts)
        self.cases += 1
        self.shown += len(texts)
        self.breaks += breaks
        per_language[0] += len(texts)
        per_language[1] += breaks
        self.exact_any += any(judge.exact(t) for t in texts)
        self.cases_distinct += len({dedupe_key(t) for t in texts}) == len(texts)
        self.raw_parses += raw_top1_parses
        self.raw_parses_nothing_shown += raw_top1_parses and not texts
        if not texts:
            return
        self.cases_with_suggestion += 1
        self.exact_top1 += judge.exact(texts[0])
        if judge.python:
            self.python_top1 += 1
            self.python_top1_static += judge.static_error(texts[0])
            self.python_top1_undefined += judge.undefined_name(texts[0])
            flakes = judge.static_error_pyflakes(texts[0])
            if flakes is not None:
                self.python_top1_pyflakes_judged += 1
                self.python_top1_pyflakes_static += flakes

    def summary(self) -> dict[str, Any]:
        def rate(part: int, whole: int) -> float | None:
            return round(part / whole, 4) if whole else None

        cases = self.cases
        result: dict[str, Any] = {
            "cases": cases,
            "suggestions_shown": self.shown,
            "parse_break_rate": rate(self.breaks, self.shown),
            "parse_breaks": self.breaks,
            "no_suggestion_rate": rate(cases - self.cases_with_suggestion, cases),
            "no_suggestion_rate_raw_parses": rate(self.raw_parses_nothing_shown, self.raw_parses),
            "raw_top1_parses": self.raw_parses,
            "python_top1_static_error_rate": rate(self.python_top1_static, self.python_top1),
            "python_top1_undefined_name_rate": rate(self.python_top1_undefined, self.python_top1),
            "python_top1_static_error_rate_pyflakes": rate(
                self.python_top1_pyflakes_static, self.python_top1_pyflakes_judged
            ),
            "python_top1_pyflakes_judged": self.python_top1_pyflakes_judged,
            "python_top1": self.python_top1,
            "exact_match_top1": rate(self.exact_top1, cases),
            "exact_match_best_of_k": rate(self.exact_any, cases),
            "best_of_k_over_top1": round(self.exact_any / self.exact_top1, 3) if self.exact_top1 else None,
            "distinct_rate": rate(self.cases_distinct, cases),
            "cases_with_suggestion": self.cases_with_suggestion,
            "by_language": {
                lang: {"shown": shown, "parse_break_rate": rate(breaks, shown)}
                for lang, (shown, breaks) in sorted(self.by_language.items())
            },
        }
        if self.postprocess_ms:
            result["postprocess_ms"] = {
                "p50": round(statistics.median(self.postprocess_ms), 3),
                "p90": rounded(percentile(self.postprocess_ms, 90), 3),
                "p95": rounded(percentile(self.postprocess_ms, 95), 3),
            }
        if self.postprocess_k8_ms:
            result["postprocess_ms"].update({
                "k8_p50": round(statistics.median(self.postprocess_k8_ms), 3),
                "k8_p90": rounded(percentile(self.postprocess_k8_ms, 90), 3),
                "k8_p95": rounded(percentile(self.postprocess_k8_ms, 95), 3),
                "k8_max": round(max(self.postprocess_k8_ms), 3),
            })
        if self.postprocess_k8_cpu_ms:
            result["postprocess_ms"].update({
                "k8_cpu_p50": round(statistics.median(self.postprocess_k8_cpu_ms), 3),
                "k8_cpu_p95": rounded(percentile(self.postprocess_k8_cpu_ms, 95), 3),
            })
        return result


def widen(candidates: list[Completion], k: int) -> list[Completion]:
    """`k` distinct candidates: the given ones plus truncated variants of them (for timing)."""
    out = list(candidates)
    seen = {c.text for c in out}
    for fraction in (0.5, 0.75, 0.25, 0.6, 0.4, 0.9):
        for candidate in candidates:
            if len(out) >= k:
                return out
            text = candidate.text[: max(1, int(len(candidate.text) * fraction))]
            if text.strip() and text not in seen:
                seen.add(text)
                tokens = max(1, int(candidate.n_tokens * fraction))
                out.append(Completion(text, logprob=candidate.logprob * fraction, n_tokens=tokens, finish_reason="length"))
    return out


def _time_postprocess(window: Window, language: str, candidates: list[Completion], repeats: int) -> tuple[float, float]:
    """(wall, CPU time of this thread) in ms, each the least over `repeats` runs."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        forget_requests()
        started, started_cpu = time.perf_counter(), time.thread_time()
        ranked_texts(window, language, candidates)
        cpu = min(cpu, (time.thread_time() - started_cpu) * 1000)
        wall = min(wall, (time.perf_counter() - started) * 1000)
    return wall, cpu


# ---------------------------------------------------------------------------------- the run

@dataclass
class _Variant:
    """Both columns of one variant."""

    raw: Column = field(default_factory=Column)
    trimmed: Column = field(default_factory=Column)

    def summary(self) -> dict[str, Any]:
        return {"raw": self.raw.summary(), "trimmed": self.trimmed.summary()}


Shown = Callable[[Window, str, list[Completion]], list[str]]  # (window, language, alternatives) -> what is shown


def ranked_texts(window: Window, language: str, candidates: list[Completion]) -> list[str]:
    """kspec's post-processing: trimmed, checked, deduplicated, ranked."""
    ranked = rank_alternatives(window.prefix, window.suffix, language, candidates, outside=frozenset(window.outside_names))
    return [r.completion.text for r in ranked]


def first_lines(window: Window, language: str, candidates: list[Completion]) -> list[str]:
    """Each answer's first line with something on it (llama.vim's accept-a-line): a peer's "trimmed"."""
    out = []
    for candidate in candidates:
        match = re.match(r"\s*\S[^\n]*\n?", candidate.text)
        if match:
            out.append(match.group(0))
    return out


def _score_case(
    judge: Judge, window: Window, candidates: list[Completion], variant: _Variant,
    config: QualityBenchConfig, timing: bool, shown_by: Shown = ranked_texts,
) -> list[str]:
    """Post-process one answer, add it to both columns; -> the shown texts."""
    language = judge.hole.language
    shown = shown_by(window, language, candidates)
    raw_texts = [c.text for c in candidates]
    raw_top1_parses = bool(raw_texts) and judge.raw_parses(raw_texts[0])
    variant.raw.add(judge, raw_texts, raw_top1_parses)
    variant.trimmed.add(judge, shown, raw_top1_parses)
    if timing and candidates and shown_by is ranked_texts:
        variant.trimmed.postprocess_ms.append(_time_postprocess(window, language, candidates, config.timing_repeats)[0])
        wall, cpu = _time_postprocess(window, language, widen(candidates, config.timing_k), config.timing_repeats)
        variant.trimmed.postprocess_k8_ms.append(wall)
        variant.trimmed.postprocess_k8_cpu_ms.append(cpu)
    return shown


def _views(hole: Hole, config: QualityBenchConfig) -> list[tuple[str, Window]]:
    whole = Window(hole.prefix, hole.suffix, "line-start", "end")
    return [("whole", whole)] + ([("windowed", cut_window(hole, config))] if config.windowed else [])


def run_quality_bench(
    engine: CompletesRequests,
    data_dir: str | Path,
    config: QualityBenchConfig = QualityBenchConfig(),
    progress: Callable[[str], None] | None = None,
    details: bool = False,
    shown_by: Shown = ranked_texts,
) -> dict[str, Any]:
    """Complete every hole once per variant (raw), post-process (`shown_by`), and return the report:
    "raw" and "trimmed" (whole file), "windowed" ({"raw", "trimmed"}) and "meta".

    With `details`, also "cases": per hole and variant what the engine saw, the raw
    alternatives (text, logprob, n_tokens, finish_reason) and the trimmed texts, for
    `replay_quality_bench`.
    """
    holes = load_holes(data_dir, config)
    variants = {name: _Variant() for name in VARIANTS}
    engine_ms: list[float] = []
    skipped: list[str] = []
    records: list[dict[str, Any]] = []
    starts: dict[str, int] = {}
    steered = 0  # requests where a branch kept a forced start (engine/decode/steering.py)
    for number, hole in enumerate(holes, 1):
        judge = Judge(hole)
        if not judge.valid:
            skipped.append(hole.id)
            continue
        for name, window in _views(hole, config):
            request = CompletionRequest(
                prefix=window.prefix, suffix=window.suffix, language=hole.language, k=config.k,
                max_tokens=config.max_tokens, deadline_ms=config.deadline_ms, raw=True, request_id=hole.id,
                outside_names=window.outside_names, **request_options(config),
            )
            started = time.perf_counter()
            result = engine.complete(request)
            engine_ms.append((time.perf_counter() - started) * 1000)
            steered += result.timing_ms.get("steered", 0.0) > 0
            candidates = list(result.completions)  # raw: untrimmed, post-processed here by each variant
            shown = _score_case(judge, window, candidates, variants[name], config, timing=True, shown_by=shown_by)
            if name == "windowed":
                key = f"{window.starts_in}/{window.ends_in}"
                starts[key] = starts.get(key, 0) + 1
            if details:
                records.append(_record(hole, name, window, candidates, shown))
                records[-1]["steered"] = [result.timing_ms.get(key, 0.0) for key in ("steered", "steer_undone")]
            if progress is not None:
                top = shown[0] if shown else ""
                progress(f"[{number}/{len(holes)}] {hole.id} ({hole.language}, {hole.kind}, {name}): top {top[:40]!r}")
    report = _report(variants, config, holes, skipped, engine.model_name, engine_ms, starts)
    report["meta"]["steered_requests"] = steered
    if details:
        report["cases"] = records
    return report


def _record(hole: Hole, variant: str, window: Window, candidates: list[Completion], shown: list[str]) -> dict[str, Any]:
    return {
        "id": hole.id, "source": hole.source, "language": hole.language, "kind": hole.kind, "variant": variant,
        "file_prefix": hole.prefix, "file_suffix": hole.suffix, "reference": hole.reference,
        "prefix": window.prefix, "suffix": window.suffix, "starts_in": window.starts_in, "ends_in": window.ends_in,
        "raw": [[c.text, c.logprob, c.n_tokens, c.finish_reason] for c in candidates],
        "trimmed": shown,
    }


def _report(
    variants: dict[str, _Variant], config: QualityBenchConfig, holes: list[Hole], skipped: list[str],
    model: str, engine_ms: list[float], starts: dict[str, int],
) -> dict[str, Any]:
    sample: dict[str, int] = {}
    for hole in holes:
        sample[hole.source] = sample.get(hole.source, 0) + 1
    report: dict[str, Any] = variants["whole"].summary()
    if config.windowed:
        report["windowed"] = variants["windowed"].summary()
    report["meta"] = {
        "model": model,
        "k": config.k,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
        "request": request_options(config),
        "cases": len(holes) - len(skipped),
        "sample": sample,
        "skipped_reference_does_not_parse": skipped,
        "engine_ms_p50": round(statistics.median(engine_ms), 1) if engine_ms else None,
        "engine_ms_p95": rounded(percentile(engine_ms, 95), 1) if engine_ms else None,
        "timing_k": config.timing_k,
        "window": {"before": config.window_before, "after": config.window_after, "starts_in/ends_in": dict(sorted(starts.items()))},
        "stdlib": f"Python {sys.version.split()[0]}",
        "parse_oracle": "python: ast.parse of the file; others: any tree-sitter ERROR/MISSING node in the file",
    }
    return report


def _distinct(candidates: list[Completion]) -> list[Completion]:
    """What the engine's raw answer is now: one alternative per `dedupe_key`, the most
    confident, by confidence (cases recorded by an older engine may hold duplicates)."""
    ranked = [(r.source_index, r) for r in rank_alternatives("", "", None, candidates, raw=True)]
    return [candidates[index] for index, _ in ranked]


def replay_quality_bench(
    cases: list[dict[str, Any]], config: QualityBenchConfig = QualityBenchConfig(), timing: bool = False,
    model: str = "replayed",
) -> dict[str, Any]:
    """The report for recorded cases (`run_quality_bench(..., details=True)["cases"]`), post-processed
    again by the code as it is now; with `timing`, post-processing is timed too."""
    variants = {name: _Variant() for name in VARIANTS}
    holes: dict[str, Hole] = {}
    starts: dict[str, int] = {}
    judges: dict[str, Judge] = {}
    for case in cases:
        hole = Hole(case["id"], case["source"], case["language"], case["file_prefix"], case["file_suffix"], case["reference"], case["kind"])
        holes.setdefault(hole.id, hole)
        judge = judges.get(hole.id) or judges.setdefault(hole.id, Judge(hole))
        candidates = _distinct([
            Completion(text, logprob=logprob, n_tokens=n_tokens, finish_reason=reason) for text, logprob, n_tokens, reason in case["raw"]
        ])
        start, end = len(hole.prefix) - len(case["prefix"]), len(hole.prefix) + len(case["suffix"])
        window = window_of(hole, start, end, case["starts_in"], case["ends_in"])
        _score_case(judge, window, candidates, variants[case["variant"]], config, timing)
        if case["variant"] == "windowed":
            key = f"{case['starts_in']}/{case['ends_in']}"
            starts[key] = starts.get(key, 0) + 1
    windowed = any(case["variant"] == "windowed" for case in cases)
    return _report(variants, replace(config, windowed=windowed), list(holes.values()), [], model, [], starts)


PEER_FIGURES = (
    "exact_match_top1", "exact_match_best_of_k", "python_top1_undefined_name_rate", "python_top1_static_error_rate",
    "no_suggestion_rate", "parse_break_rate",
)  # fmt: skip


def beside_peer(report: dict[str, Any], peer_report: dict[str, Any], file_name: str) -> dict[str, Any]:
    """kspec's report with a peer's on the same holes and windows (`run_quality_bench` of an
    `InfillPeer`, `shown_by=first_lines`): "peer" holds the peer's figures for its text as returned
    (its raw column: what llama.vim shows and Tab accepts) and for its first line (what llama.vim's
    accept-a-line takes), "versus_peer" per variant each figure as [kspec shown, peer as returned,
    peer's first line] and kspec's top-1 exact matches over the better of the peer's two."""
    versus: dict[str, Any] = {}
    peer: dict[str, Any] = {"model": peer_report["meta"]["model"], "file": file_name}
    for variant in VARIANTS:
        ours = report["trimmed"] if variant == "whole" else report.get("windowed", {}).get("trimmed")
        peer_columns = peer_report if variant == "whole" else peer_report.get("windowed", {})
        theirs, their_line = peer_columns.get("raw"), peer_columns.get("trimmed")
        if ours is None or theirs is None or their_line is None:
            continue
        peer[variant] = {"as_returned": theirs, "first_line": their_line}
        row: dict[str, Any] = {name: [ours.get(name), theirs.get(name), their_line.get(name)] for name in PEER_FIGURES}
        top1, peer_top1 = ours["exact_match_top1"], max(theirs["exact_match_top1"] or 0, their_line["exact_match_top1"] or 0)
        row["top1_over_peer"] = round(top1 / peer_top1, 3) if top1 is not None and peer_top1 else None
        row["best_of_k_over_top1"] = ours["best_of_k_over_top1"]
        versus[variant] = row
    peer["engine_ms_p50"] = peer_report["meta"]["engine_ms_p50"]
    return {**report, "peer": peer, "versus_peer": versus}
