"""`kspec eval`: complete every case of a JSONL file, write results in case order, summarise."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from kspec.bench.stats import percentile
from kspec.engine.api import CompletionRequest
from kspec.engine.completion import CompletionEngine
from kspec.engine.errors import InputError
from kspec.engine.syntax import Checker, detect_language
from kspec.engine.syntax.rank import dedupe_key  # "equal after whitespace normalisation", as deduplication uses

REFERENCE_FIELDS = ("reference", "middle", "canonical_solution")


def read_cases(path: str) -> Iterator[dict[str, Any]]:
    source = Path(path)
    if not source.is_file():
        raise InputError(f"{path}: no such file")
    with source.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                case = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(case, dict) or "id" not in case or "prefix" not in case:
                raise InputError(f'{path}:{number}: a case needs at least "id" and "prefix"')
            yield case


def evaluate_file(
    engine: CompletionEngine, cases_path: str, out_path: str, request_fields: dict[str, Any], progress: bool = False
) -> dict[str, Any]:
    """Completes every case in order; `progress`: a progress bar on stderr."""
    from tqdm import tqdm

    latencies: list[float] = []
    exact_top = exact_any = with_reference = shown = breaking = checked_top = top_static = 0
    cases = list(read_cases(cases_path))  # a bad line is reported before any work
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as results:
        for case in tqdm(cases, desc="kspec eval", unit="case", disable=not progress, file=sys.stderr):
            request = CompletionRequest(
                prefix=case["prefix"],
                suffix=case.get("suffix", ""),
                language=case.get("language", ""),
                path=case.get("path", ""),
                request_id=str(case["id"]),
                **request_fields,
            )
            result = engine.complete(request)
            latency = result.timing_ms.get("total", 0.0)
            latencies.append(latency)
            texts = [c.text for c in result.completions]
            shown += len(texts)
            language = detect_language(request.language, request.path)
            if texts and language is not None:
                checker = Checker(request.prefix, request.suffix, language)
                results_checked = [checker.check(text) for text in texts]
                breaking += sum(r.breaks_parse for r in results_checked)
                if language == "python":
                    checked_top += 1
                    top_static += results_checked[0].static_errors > 0
            reference = next((case[f] for f in REFERENCE_FIELDS if isinstance(case.get(f), str)), None)
            if reference is not None:
                with_reference += 1
                wanted = dedupe_key(reference)
                exact_top += bool(texts) and dedupe_key(texts[0]) == wanted
                exact_any += any(dedupe_key(t) == wanted for t in texts)
            extra = {key: value for key, value in case.items() if key not in ("prefix", "suffix")}
            line = {**extra, "id": case["id"], "completions": [asdict(c) for c in result.completions], "latency_ms": latency}
            results.write(json.dumps(line, ensure_ascii=False) + "\n")
    summary = summarize(latencies, shown, with_reference, exact_top, exact_any)
    summary["shown_breaking_parse"] = breaking / shown if shown else None
    summary["top1_static_error_rate_python"] = top_static / checked_top if checked_top else None
    return summary


def summarize(latencies: list[float], shown: int, with_reference: int, exact_top: int, exact_any: int) -> dict[str, Any]:
    return {
        "cases": len(latencies),
        "suggestions_shown": shown,
        "exact_match_top1": exact_top / with_reference if with_reference else None,
        "exact_match_best_of_k": exact_any / with_reference if with_reference else None,
        "cases_with_reference": with_reference,
        "latency_ms": {
            "p50": percentile(latencies, 50) or 0.0,
            "p90": percentile(latencies, 90) or 0.0,
            "p99": percentile(latencies, 99) or 0.0,
        },
    }
