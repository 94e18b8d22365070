"""Keystroke replay through the language server: what a typing user gets.

A real file is typed character by character at `cps` characters per second from
several points (the rest of the line at each point removed first). Every keystroke sends a
`didChange` and an automatic inline-completion request, and, like an editor, cancels
the previous request if it is still pending. Two configurations run side by side,
point by point (A B A B, each with its own server and engine in this process):

  kspec     typeahead cache on, engines from `engine_factory` (prefix cache on)
  baseline  typeahead cache off, engines from `baseline_engine_factory` (prefix cache off)

Reported: p50 / p95 latency of answered requests (a response with at least one item,
received before the next keystroke or, for the last keystroke of a point, at all),
the typeahead hit rate (requests served from the typeahead cache / requests), and the
share of requests cancelled because the next keystroke came first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.io_ import run_async
from pygls.lsp.client import LanguageClient

from kspec.bench.stats import percentile, rounded
from kspec.engine.serve.runner import EngineFactory, default_engine_factory
from kspec.lsp_server.server import KspecServer, ServerOptions

log = logging.getLogger("kspec.bench")


@dataclass
class Outcome:
    sent: float
    latency_ms: float | None = None  # set when answered with items in time
    cancelled: bool = False


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    typeahead_hits: int = 0
    engine_calls: int = 0

    def summary(self) -> dict[str, Any]:
        latencies = sorted(o.latency_ms for o in self.outcomes if o.latency_ms is not None)
        total = len(self.outcomes)
        return {
            "p50_ms": rounded(percentile(latencies, 50)),
            "p95_ms": rounded(percentile(latencies, 95)),
            "typeahead_hit_rate": self.typeahead_hits / total if total else 0.0,
            "cancelled_share": sum(o.cancelled for o in self.outcomes) / total if total else 0.0,
            "requests": total,
            "answered": len(latencies),
            "engine_calls": self.engine_calls,
        }


class ThreadServer:
    """A KspecServer on a thread of this process, spoken to over two pipes."""

    def __init__(self, options: ServerOptions):
        to_server_r, self._to_server_w = os.pipe()
        self._from_server_r, from_server_w = os.pipe()
        self.server = KspecServer(options)
        stdin, stdout = os.fdopen(to_server_r, "rb"), os.fdopen(from_server_w, "wb")
        self.thread = threading.Thread(target=self.server.start_io, args=(stdin, stdout), name="kspec-bench-server", daemon=True)
        self.thread.start()
        self.client = LanguageClient("kspec-bench", "0")
        self.client.feature("$/kspec/status")(lambda params: None)
        self.client.feature(lsp.WINDOW_SHOW_MESSAGE)(lambda params: log.warning("server: %s", params.message))
        self._task: asyncio.Task | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self._from_server_r, "rb", buffering=0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(self._to_server_w, "wb", buffering=0))
        self.client.protocol.set_writer(asyncio.StreamWriter(transport, protocol, None, loop))
        self._task = asyncio.ensure_future(run_async(stop_event=self.client._stop_event, reader=reader, protocol=self.client.protocol, logger=log))

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("server did not shut down cleanly: %s", exc)
        await asyncio.to_thread(self.thread.join, 30)
        self.client._stop_event.set()
        if self._task is not None:
            self._task.cancel()


def typing_points(text: str, points: int, length: int) -> list[int]:
    """Offsets of `points` line starts spread over the file, each followed by `length` characters of code."""
    starts, offset = [], 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", '"', "'")) and offset + length <= len(text):
            starts.append(offset + len(line) - len(line.lstrip()))
        offset += len(line)
    if len(starts) < points:
        raise ValueError(f"the file has {len(starts)} code lines; {points} typing points wanted")
    step = len(starts) / points
    return [starts[int(i * step + step / 2)] for i in range(points)]


def _utf16_position(text: str, offset: int) -> lsp.Position:
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return lsp.Position(line=line, character=len(text[start:offset].encode("utf-16-le")) // 2)


async def replay_point(server: ThreadServer, uri: str, text: str, point: int, length: int, cps: float, run: Run, deadline_s: float) -> None:
    client = server.client
    # the line being typed is removed from the point on: the user writes it anew, and the
    # suffix (the following lines) must not already hold the completion the model should make
    line_end = text.find("\n", point + length)
    document = text[:point] + text[line_end if line_end != -1 else len(text) :]
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=0, text=document)))
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending: tuple[str, asyncio.Future, Outcome] | None = None
    for index in range(length):
        await asyncio.sleep(max(0.0, start + index / cps - loop.time()))
        if pending is not None and not pending[1].done():
            pending[2].cancelled = True
            client.cancel_request(lsp.CancelParams(id=pending[0]))
        char = text[point + index]
        cursor = point + index
        position = _utf16_position(document, cursor)
        document = document[:cursor] + char + document[cursor:]
        change = lsp.TextDocumentContentChangePartial(range=lsp.Range(position, position), text=char)
        client.text_document_did_change(lsp.DidChangeTextDocumentParams(lsp.VersionedTextDocumentIdentifier(uri=uri, version=index + 1), [change]))
        request_id = f"{uri}#{index}"
        params = lsp.InlineCompletionParams(
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Automatic),
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=_utf16_position(document, cursor + 1),
        )
        outcome = Outcome(sent=loop.time())
        run.outcomes.append(outcome)
        future = asyncio.ensure_future(client.protocol.send_request_async(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=request_id))
        future.add_done_callback(lambda f, o=outcome: _record(f, o, loop.time()))
        pending = (request_id, future, outcome)
    if pending is not None:
        await asyncio.wait({pending[1]}, timeout=deadline_s)
    client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri=uri)))


def _record(future: asyncio.Future, outcome: Outcome, now: float) -> None:
    if future.cancelled() or future.exception() is not None or outcome.cancelled:
        return
    result = future.result()
    if result is not None and result.items:
        outcome.latency_ms = (now - outcome.sent) * 1000


async def _bench(
    text: str,
    settings: dict[str, Any],
    points: list[int],
    length: int,
    cps: float,
    engine_factory: EngineFactory,
    baseline_engine_factory: EngineFactory,
) -> dict[str, Any]:
    configurations = {
        "kspec": (engine_factory, {**settings, "typeahead": True}),
        "baseline": (baseline_engine_factory, {**settings, "typeahead": False}),
    }
    servers: dict[str, ThreadServer] = {}
    runs = {name: Run() for name in configurations}
    try:
        for name, (factory, options) in configurations.items():
            server = servers[name] = ThreadServer(ServerOptions(engine="inprocess", engine_factory=factory))
            await server.connect()
            await asyncio.wait_for(server.client.initialize_async(lsp.InitializeParams(capabilities=lsp.ClientCapabilities(), initialization_options=options)), 60)
            server.client.initialized(lsp.InitializedParams())
        deadline_s = settings["deadlineMs"] / 1000 + 5
        for warm in configurations:  # load the models before measuring
            await _warm_up(servers[warm], text, deadline_s * 12)
        for number, point in enumerate(points):
            for name in configurations:  # A B A B: both see the same moments of machine noise
                await replay_point(servers[name], f"file:///bench/{name}/{number}.py", text, point, length, cps, runs[name], deadline_s)
        for name, server in servers.items():
            stats = await asyncio.wait_for(server.client.protocol.send_request_async("kspec/stats", None), 10)
            runs[name].typeahead_hits, runs[name].engine_calls = stats.typeahead_hits, stats.engine_calls - 1  # minus the warm-up
    finally:
        for server in servers.values():
            await server.close()
    kspec, baseline = runs["kspec"].summary(), runs["baseline"].summary()
    return {
        "p50_ms": kspec["p50_ms"],
        "p95_ms": kspec["p95_ms"],
        "typeahead_hit_rate": round(kspec["typeahead_hit_rate"], 3),
        "cancelled_share": round(kspec["cancelled_share"], 3),
        "baseline_p50_ms": baseline["p50_ms"],
        "baseline_p95_ms": baseline["p95_ms"],
        "baseline_cancelled_share": round(baseline["cancelled_share"], 3),
        "requests": kspec["requests"],
        "answered": kspec["answered"],
        "baseline_answered": baseline["answered"],
        "engine_calls": kspec["engine_calls"],
        "baseline_engine_calls": baseline["engine_calls"],
    }


async def _warm_up(server: ThreadServer, text: str, timeout_s: float) -> None:
    uri = "file:///bench/warm-up.py"
    server.client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=0, text=text)))
    params = lsp.InlineCompletionParams(
        context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        text_document=lsp.TextDocumentIdentifier(uri=uri),
        position=lsp.Position(line=0, character=0),
    )
    await asyncio.wait_for(server.client.text_document_inline_completion_async(params), timeout_s)
    server.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri=uri)))


def bench_keystroke_lsp(
    source: str | Path | None = None,
    model: str | None = None,
    points: int = 3,
    chars_per_point: int = 24,
    cps: float = 10.0,
    k: int = 3,
    max_tokens: int = 24,
    debounce_ms: float = 40.0,
    deadline_ms: float = 3000.0,
    device: str = "cpu",
    raw: bool = False,
    engine_factory: EngineFactory = default_engine_factory,
    baseline_engine_factory: EngineFactory | None = None,
) -> dict[str, Any]:
    """Replay typing `source` (default: Python's textwrap.py) and measure; see the module docstring.

    `baseline_engine_factory` builds the engines of the baseline run (e.g. with the
    prefix cache off); by default the same factory as the kspec run. `raw` skips trimming
    (random test models only make garbage, which trimming drops)."""
    path = Path(source) if source is not None else Path(textwrap.__file__)
    text = path.read_text(encoding="utf-8")
    settings = {"k": k, "maxTokens": max_tokens, "debounceMs": debounce_ms, "deadlineMs": deadline_ms, "device": device, "raw": raw}
    if model is not None:
        settings["model"] = model
    started = time.perf_counter()
    report = asyncio.run(
        _bench(text, settings, typing_points(text, points, chars_per_point), chars_per_point, cps, engine_factory, baseline_engine_factory or engine_factory)
    )
    report.update(
        {
            "source": str(path),
            "points": points,
            "chars_per_point": chars_per_point,
            "cps": cps,
            "k": k,
            "max_tokens": max_tokens,
            "device": device,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    )
    return report
