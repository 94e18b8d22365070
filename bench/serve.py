"""`kspec bench serve`: N editors typing at once against one engine.

Each simulated editor types in its own document (a different stdlib file and point per
editor): a burst of `chars_per_burst` characters at `cps` characters per second, then it
asks for a completion at the cursor and waits for the answer (what the language
server's debounce makes of typing: one request per pause), `requests_per_editor` times.
Reported per configuration: answered requests per second over the run's wall time, and
p50 / p95 latency of the answers.

Configurations run interleaved (A B A B ..., one at a time, medians over repeats):
  * in-process: the engine with continuous batching (`batched`, up to 16 requests per
    round) vs one request at a time (`serial`), sharing one loaded model whose prefix
    cache is cleared before every run;
  * `--url`: any OpenAI-compatible endpoint(s) (kspec's own, Ray Serve, vLLM...).
"""

from __future__ import annotations

import asyncio
import statistics
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.bench.keystroke import typing_points
from kspec.bench.stats import percentile, rounded
from kspec.lsp_server.http_client import request_json
from kspec.engine.serve.network import EngineUrl, parse_engine_url

Complete = Callable[[CompletionRequest], Awaitable[Any]]

SOURCES = ("textwrap.py", "json/decoder.py", "argparse.py", "shlex.py", "csv.py", "fractions.py", "heapq.py", "calendar.py")


@dataclass(frozen=True)
class ServeBenchConfig:
    editors: tuple[int, ...] = (1, 4, 16)
    requests_per_editor: int = 3
    chars_per_burst: int = 5
    cps: float = 10.0
    k: int = 2
    max_tokens: int = 16
    deadline_ms: float = 120000.0
    repeats: int = 1

    def __post_init__(self) -> None:
        if not self.editors or min(self.editors) < 1:
            raise ValueError("editors must be a list of counts >= 1")
        if self.requests_per_editor < 1 or self.chars_per_burst < 1 or self.cps <= 0 or self.repeats < 1:
            raise ValueError("requests, characters per burst, cps and repeats must be positive")


@dataclass
class TypedFile:
    name: str
    text: str
    point: int  # where the editor starts typing; the rest of that line is removed


@dataclass
class RunResult:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    largest_batch: int | None = None  # most requests verified together (engines in this process report it)

    def summary(self) -> dict[str, Any]:
        return {
            "throughput_rps": round(len(self.latencies_ms) / self.wall_s, 3) if self.wall_s else 0.0,
            "p50_ms": rounded(percentile(self.latencies_ms, 50)),
            "p95_ms": rounded(percentile(self.latencies_ms, 95)),
            "answered": len(self.latencies_ms),
            "errors": self.errors,
            "wall_s": round(self.wall_s, 2),
            "largest_batch": self.largest_batch,
        }


def documents(count: int, config: ServeBenchConfig) -> list[TypedFile]:
    """One document per editor: stdlib files, several points per file when needed."""
    folder = Path(textwrap.__file__).parent
    per_file = -(-count // len(SOURCES))
    docs: list[TypedFile] = []
    length = config.chars_per_burst * config.requests_per_editor
    for name in SOURCES:
        text = (folder / name).read_text()
        for point in typing_points(text, per_file, length):
            docs.append(TypedFile(name, text, point))
    return docs[:count]


def _request(doc: TypedFile, typed: int, config: ServeBenchConfig) -> CompletionRequest:
    line_end = doc.text.find("\n", doc.point)
    return CompletionRequest(
        prefix=doc.text[: doc.point + typed],
        suffix=doc.text[line_end:] if line_end != -1 else "",
        path=f"/bench/{doc.name}#{doc.point}",
        k=config.k,
        max_tokens=config.max_tokens,
        deadline_ms=config.deadline_ms,
    )


async def _editor(doc: TypedFile, complete: Complete, config: ServeBenchConfig, result: RunResult) -> None:
    typed = 0
    for _ in range(config.requests_per_editor):
        await asyncio.sleep(config.chars_per_burst / config.cps)  # the user typing the burst (simulated time)
        typed += config.chars_per_burst
        started = time.perf_counter()
        try:
            reply = await complete(_request(doc, typed, config))
        except Exception:  # counted, the editor goes on typing
            result.errors += 1
            continue
        result.latencies_ms.append((time.perf_counter() - started) * 1000)
        if isinstance(reply, CompletionResult) and "batch_requests_max" in reply.timing_ms:
            result.largest_batch = max(result.largest_batch or 0, int(reply.timing_ms["batch_requests_max"]))


async def run_editors(count: int, complete: Complete, config: ServeBenchConfig) -> RunResult:
    result = RunResult()
    started = time.perf_counter()
    await asyncio.gather(*(_editor(doc, complete, config, result) for doc in documents(count, config)))
    result.wall_s = time.perf_counter() - started
    return result


def openai_client(url: EngineUrl, token: str | None) -> Complete:
    headers = {"authorization": f"Bearer {token}"} if token else {}

    async def complete(request: CompletionRequest) -> Any:
        body = {"prompt": request.prefix, "suffix": request.suffix, "n": request.k, "max_tokens": request.max_tokens,
                "temperature": 0, "user": request.path,
                "kspec": {"postprocess": True, "path": request.path, "deadline_ms": request.deadline_ms}}  # fmt: skip
        status, reply = await request_json(url, "POST", "/completions", body, headers, timeout_s=request.deadline_ms / 1000)
        if status != 200:
            raise RuntimeError(f"{status}: {reply}")
        return reply

    return complete


def _median_summary(runs: list[RunResult]) -> dict[str, Any]:
    summaries = [run.summary() for run in runs]
    merged: dict[str, Any] = {}
    for key in summaries[0]:
        values = [s[key] for s in summaries if s[key] is not None]
        merged[key] = round(statistics.median(values), 3) if values else None
    return merged


async def _compare(targets: dict[str, Complete], config: ServeBenchConfig, before_run: Callable[[], None]) -> dict[str, Any]:
    report: dict[str, Any] = {"config": {**config.__dict__, "editors": list(config.editors)}, "runs": {}}
    for count in config.editors:
        runs: dict[str, list[RunResult]] = {name: [] for name in targets}
        for _ in range(config.repeats):
            for name, complete in targets.items():  # interleaved: A B A B
                before_run()
                runs[name].append(await run_editors(count, complete, config))
        row = {name: _median_summary(results) for name, results in runs.items()}
        names = list(targets)
        if len(names) == 2 and row[names[1]]["throughput_rps"]:
            row[f"throughput_{names[0]}_over_{names[1]}"] = round(row[names[0]]["throughput_rps"] / row[names[1]]["throughput_rps"], 2)
        report["runs"][str(count)] = row
    return report


def bench_serve_inprocess(engine_config: Any, config: ServeBenchConfig) -> dict[str, Any]:
    """Continuous batching vs one request at a time, in this process, one model."""
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.serve.runner import EngineRunner

    engine = CompletionEngine.load(engine_config)

    async def main() -> dict[str, Any]:
        runners = {name: EngineRunner(engine_config, lambda c, p: engine, lambda s: None, limit) for name, limit in (("batched", 16), ("serial", 1))}
        for runner in runners.values():
            runner.start()
        try:
            await asyncio.gather(*(r.complete(CompletionRequest(prefix="def f():\n    ", k=1, max_tokens=2)) for r in runners.values()))  # loaded, warm
            return await _compare({name: r.complete for name, r in runners.items()}, config, engine.clear_caches)
        finally:
            for runner in runners.values():
                runner.stop()

    report = asyncio.run(main())
    report["model"] = engine.model_name
    return report


def bench_serve_urls(urls: list[str], token: str | None, config: ServeBenchConfig) -> dict[str, Any]:
    targets = {url: openai_client(parse_engine_url(url), token) for url in urls}
    return asyncio.run(_compare(targets, config, lambda: None))



def bench_hop(engine_config: Any, url: str, token: str | None, samples: int = 10) -> dict[str, Any]:
    """What the network path costs: the same request answered by an engine in this
    process vs by the endpoint at `url` (HTTP, and for a cluster the Ray hop), alternating,
    after two warm-up pairs (both sides' prefix caches hold the prompt); medians."""
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.serve.runner import EngineRunner

    engine = CompletionEngine.load(engine_config)
    client = openai_client(parse_engine_url(url), token)
    prefix = (Path(textwrap.__file__).read_text())[:3000]

    async def main() -> dict[str, Any]:
        runner = EngineRunner(engine_config, lambda c, p: engine, lambda s: None)
        runner.start()
        report: dict[str, Any] = {"url": url, "model": engine.model_name}
        try:
            for name, k, max_tokens in (("n=1 max_tokens=1", 1, 1), ("n=2 max_tokens=16", 2, 16)):
                request = CompletionRequest(prefix=prefix, k=k, max_tokens=max_tokens, path=f"/bench/hop-{k}-{max_tokens}", deadline_ms=120000.0)
                times: dict[str, list[float]] = {"in_process": [], "endpoint": []}
                for index in range(samples + 2):
                    for side, complete in (("in_process", runner.complete), ("endpoint", client)):
                        started = time.perf_counter()
                        await complete(request)
                        if index >= 2:
                            times[side].append((time.perf_counter() - started) * 1000)
                medians = {side: round(statistics.median(values), 1) for side, values in times.items()}
                report[name] = {**{f"{side}_ms": value for side, value in medians.items()}, "overhead_ms": round(medians["endpoint"] - medians["in_process"], 1), "samples": samples}
        finally:
            runner.stop()
        return report

    return asyncio.run(main())
