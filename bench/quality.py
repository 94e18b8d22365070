"""`kspec bench quality`: what trimming, checking and ranking do for the user, raw vs trimmed.

Holes are cut from ../shared/data (read-only; never copied into the repo):
* Python: HumanEval-infilling SingleLine and MultiLine tasks as given (prefix = `prompt`,
  reference = `canonical_solution`, suffix = `suffix`; the cursor is at column 1);
* Java, JavaScript, TypeScript, C++: MBXP reference solutions (`prompt` +
  `canonical_solution`); one line of the solution is picked, and the hole is either the
  whole line with the cursor after its indentation, or the rest of the line from a token
  boundary (mid-line). Lines that are only punctuation (`}`, `});`) are not picked, nor
  solutions that do not parse (several MBTSP "TypeScript" solutions are Java).

The sample is small on purpose (a CPU run on 2 cores must finish in minutes): by default
10 SingleLine + 10 MultiLine Python tasks and 5 holes per MBXP language, 40 cases, chosen
with a seeded RNG (`QualityBenchConfig.seed`), so every run sees the same cases.

Each case is completed once with `raw=True` (untrimmed alternatives); the trimmed+ranked
list is `rank_alternatives` applied to those same alternatives, so both columns judge the
same generations. Figures per column:
* `parse_break_rate`: share of shown suggestions after which the file does not parse.
  Python: `ast.parse` of prefix + suggestion + suffix (CPython is the oracle). Other
  languages: any tree-sitter ERROR/MISSING node in that file. Either way the file with the
  reference in the hole parses (holes where it does not are skipped), so a suggestion that
  leaves the hole unfilled (a header without its body) counts as breaking it.
* `python_top1_static_error_rate`: share of top-1 Python suggestions that introduce an
  undefined name or an unused variable (tree-sitter scopes, names the reference also gets
  flagged for excluded); `..._pyflakes`: the same by pyflakes, over top-1s that parse
  (whole-file messages the reference file does not get, about names the suggestion writes;
  a name the hole should have defined and did not is the suffix's error, not counted).
* `exact_match_top1` / `exact_match_best_of_k`: whitespace-normalised equality with the
  reference.
* `postprocess_ms`: time of `rank_alternatives` per request (min of 3 runs per case, then
  p50/p90 over cases) for the k alternatives the engine returned, and for 8 alternatives
  (the engine's k plus truncated variants of them, so that every request has 8 distinct
  texts to trim, check and rank).
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pyflakes import checker as pyflakes_checker
from pyflakes import messages as pyflakes_messages

from kspec.bench.stats import percentile, rounded
from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.syntax import Candidate, Checker, rank_alternatives
from kspec.engine.syntax.checks import error_nodes, python_parses
from kspec.engine.syntax.rank import dedupe_key
from kspec.engine.syntax.languages import new_parser

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


class CompletesRequests(Protocol):
    model_name: str

    def complete(self, request: CompletionRequest) -> CompletionResult: ...


@dataclass(frozen=True)
class QualityBenchConfig:
    humaneval_single: int = 10
    humaneval_multi: int = 10
    mbxp_per_language: int = 5
    k: int = 4
    max_tokens: int = 48
    seed: int = 0
    deadline_ms: float = 120_000.0  # generous: the figures are about quality, not latency
    timing_repeats: int = 3
    timing_k: int = 8

    def __post_init__(self) -> None:
        for name in ("humaneval_single", "humaneval_multi", "mbxp_per_language"):
            if getattr(self, name) < 0:
                raise ValueError(f"QualityBenchConfig.{name} must be >= 0")
        for name in ("k", "max_tokens", "timing_repeats", "timing_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"QualityBenchConfig.{name} must be >= 1")
        if self.deadline_ms <= 0:
            raise ValueError("QualityBenchConfig.deadline_ms must be > 0")


@dataclass(frozen=True)
class Hole:
    id: str
    source: str  # humaneval-single, humaneval-multi, mbxp-java, ...
    language: str
    prefix: str
    suffix: str
    reference: str
    kind: str  # "given" (HumanEval), "line" or "mid-line" (MBXP)


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
    return sum(c.isalnum() for c in content) >= 3 and not content.startswith(("//", "/*", "*"))


def cut_line_hole(task_id: str, source: str, language: str, text: str, start: int, rng: random.Random) -> Hole | None:
    """A hole in one line of `text` (a line of the reference solution starting at `start`)."""
    candidates = []
    pos = start
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        if _pickable(text[pos:end]):
            candidates.append((pos, end))
        pos = end + 1
    if not candidates:
        return None
    line_start, line_end = rng.choice(candidates)
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


def load_holes(data_dir: str | Path, config: QualityBenchConfig) -> list[Hole]:
    """The seeded sample of holes (same config, same holes)."""
    root = Path(data_dir)
    rng = random.Random(config.seed)
    holes = humaneval_holes(root, "humaneval-single", config.humaneval_single, rng)
    holes += humaneval_holes(root, "humaneval-multi", config.humaneval_multi, rng)
    for language in MBXP_FILES:
        holes += mbxp_holes(root, language, config.mbxp_per_language, rng)
    return holes


# ------------------------------------------------------------------------------- judging

_FLAKES = (pyflakes_messages.UndefinedName, pyflakes_messages.UnusedVariable)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def pyflakes_names(source: str) -> set[tuple[str, str]]:
    report = pyflakes_checker.Checker(ast.parse(source), filename="hole.py")
    return {(type(m).__name__, str(m.message_args[0])) for m in report.messages if isinstance(m, _FLAKES)}


class Judge:
    """Everything about one hole that is the same for every suggestion."""

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

    def exact(self, text: str) -> bool:
        return dedupe_key(text) == dedupe_key(self.hole.reference)


@dataclass
class Column:
    """Running totals for one column (raw or trimmed)."""

    shown: int = 0
    breaks: int = 0
    cases_with_suggestion: int = 0
    exact_top1: int = 0
    exact_any: int = 0
    python_top1: int = 0
    python_top1_static: int = 0
    python_top1_pyflakes_judged: int = 0
    python_top1_pyflakes_static: int = 0
    postprocess_ms: list[float] = field(default_factory=list)
    postprocess_k8_ms: list[float] = field(default_factory=list)
    by_language: dict[str, list[int]] = field(default_factory=dict)  # language -> [shown, breaks]

    def add(self, judge: Judge, texts: list[str]) -> None:
        language = judge.hole.language
        per_language = self.by_language.setdefault(language, [0, 0])
        breaks = sum(judge.breaks_parse(t) for t in texts)
        self.shown += len(texts)
        self.breaks += breaks
        per_language[0] += len(texts)
        per_language[1] += breaks
        self.exact_any += any(judge.exact(t) for t in texts)
        if not texts:
            return
        self.cases_with_suggestion += 1
        self.exact_top1 += judge.exact(texts[0])
        if judge.python:
            self.python_top1 += 1
            self.python_top1_static += judge.static_error(texts[0])
            flakes = judge.static_error_pyflakes(texts[0])
            if flakes is not None:
                self.python_top1_pyflakes_judged += 1
                self.python_top1_pyflakes_static += flakes

    def summary(self, cases: int) -> dict[str, Any]:
        def rate(part: int, whole: int) -> float | None:
            return round(part / whole, 4) if whole else None

        result: dict[str, Any] = {
            "suggestions_shown": self.shown,
            "parse_break_rate": rate(self.breaks, self.shown),
            "parse_breaks": self.breaks,
            "python_top1_static_error_rate": rate(self.python_top1_static, self.python_top1),
            "python_top1_static_error_rate_pyflakes": rate(
                self.python_top1_pyflakes_static, self.python_top1_pyflakes_judged
            ),
            "python_top1_pyflakes_judged": self.python_top1_pyflakes_judged,
            "python_top1": self.python_top1,
            "exact_match_top1": rate(self.exact_top1, cases),
            "exact_match_best_of_k": rate(self.exact_any, cases),
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
            }
        if self.postprocess_k8_ms:
            result["postprocess_ms"].update({
                "k8_p50": round(statistics.median(self.postprocess_k8_ms), 3),
                "k8_p90": rounded(percentile(self.postprocess_k8_ms, 90), 3),
                "k8_max": round(max(self.postprocess_k8_ms), 3),
            })
        return result


def widen(candidates: list[Candidate], k: int) -> list[Candidate]:
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
                out.append(Candidate(text, candidate.logprob * fraction, max(1, int(candidate.n_tokens * fraction)), "length"))
    return out


def _time_postprocess(hole: Hole, candidates: list[Candidate], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        rank_alternatives(hole.prefix, hole.suffix, hole.language, candidates)
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


# ---------------------------------------------------------------------------------- the run

def run_quality_bench(
    engine: CompletesRequests,
    data_dir: str | Path,
    config: QualityBenchConfig = QualityBenchConfig(),
    progress: Callable[[str], None] | None = None,
    details: bool = False,
) -> dict[str, Any]:
    """Complete every hole once (raw), post-process, and return {"raw", "trimmed", "meta"}.

    With `details`, also "cases": per hole its prefix/suffix/reference, the raw alternatives
    (text, logprob, n_tokens, finish_reason) and the trimmed texts, to replay post-processing
    offline without the model.
    """
    holes = load_holes(data_dir, config)
    raw, trimmed = Column(), Column()
    engine_ms: list[float] = []
    skipped: list[str] = []
    records: list[dict[str, Any]] = []
    for number, hole in enumerate(holes, 1):
        judge = Judge(hole)
        if not judge.valid:
            skipped.append(hole.id)
            continue
        request = CompletionRequest(
            prefix=hole.prefix, suffix=hole.suffix, language=hole.language, k=config.k,
            max_tokens=config.max_tokens, deadline_ms=config.deadline_ms, raw=True, request_id=hole.id,
        )
        started = time.perf_counter()
        result = engine.complete(request)
        engine_ms.append((time.perf_counter() - started) * 1000)
        candidates = [Candidate(c.text, c.logprob, c.n_tokens, c.finish_reason) for c in result.completions]
        ranked = rank_alternatives(hole.prefix, hole.suffix, hole.language, candidates)
        raw.add(judge, [c.text for c in candidates])
        trimmed.add(judge, [r.completion.text for r in ranked])
        if candidates:
            trimmed.postprocess_ms.append(_time_postprocess(hole, candidates, config.timing_repeats))
            wide = widen(candidates, config.timing_k)
            trimmed.postprocess_k8_ms.append(_time_postprocess(hole, wide, config.timing_repeats))
        if details:
            records.append({
                "id": hole.id, "language": hole.language, "kind": hole.kind, "prefix": hole.prefix,
                "suffix": hole.suffix, "reference": hole.reference,
                "raw": [[c.text, c.logprob, c.n_tokens, c.finish_reason] for c in candidates],
                "trimmed": [r.completion.text for r in ranked],
            })
        if progress is not None:
            top = ranked[0].completion.text if ranked else ""
            progress(f"[{number}/{len(holes)}] {hole.id} ({hole.language}, {hole.kind}): top {top[:40]!r}")
    cases = len(holes) - len(skipped)
    sample: dict[str, int] = {}
    for hole in holes:
        sample[hole.source] = sample.get(hole.source, 0) + 1
    report: dict[str, Any] = {
        "raw": raw.summary(cases),
        "trimmed": trimmed.summary(cases),
        "meta": {
            "model": engine.model_name,
            "k": config.k,
            "max_tokens": config.max_tokens,
            "seed": config.seed,
            "cases": cases,
            "sample": sample,
            "skipped_reference_does_not_parse": skipped,
            "engine_ms_p50": round(statistics.median(engine_ms), 1) if engine_ms else None,
            "timing_k": config.timing_k,
            "parse_oracle": "python: ast.parse of the file; others: any tree-sitter ERROR/MISSING node in the file",
        },
    }
    if details:
        report["cases"] = records
    return report
