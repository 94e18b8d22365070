"""Keystroke replay through the language server: what a typing user gets.

A real file is typed character by character at `cps` characters per second from
several points, with a pause of `pause_ms` after each character that ends a word (a space,
a bracket, punctuation: where a typist stops to think and a suggestion can be read; 0:
typing without a break). At each point the line being typed is removed from the point on (see
`removed_end`: the rest of that line, and the following lines when the typed span runs
past it) and the user writes it anew. Every keystroke sends a `didChange` and an
automatic inline-completion request, and, like an editor, cancels the previous request
if it is still pending. Like the editor plugins, a `$/kspec/suggestionsUpdated`
notification for the document at the version just typed re-requests at once (answered
from the server's typeahead cache: the longer version of what is shown).

Two configurations, each with its own server and engine in this process, run side by
side point by point (A B A B: both see the same moments of machine noise):

  kspec     the server's current defaults (`kspec_settings`, default none: what a user
            gets without settings), engines from `engine_factory`
  previous  a baseline without the typist's shaping: fp32 weights, no early answer
            (`firstAnswerMs` 0) and fixed k / maxTokens / debounce / deadline
            (`PREVIOUS_SETTINGS`), engines from `previous_engine_factory`

Settings the server does not know (yet) are not sent (the server reports unknown keys);
the report lists them under `settings.not_sent`. Reported per configuration:

  answered_share       keystrokes answered with at least one item before the next keystroke
                       (for the last keystroke of a point: at all) / keystrokes; "answered"
                       is the keystroke's request, or a refresh for it when that request's
                       own answer was empty
  ttfs_p50_ms, ttfs_p95_ms
                       time to first suggestion: from a keystroke's request to the first
                       answer with items, over the answered keystrokes
  predict_top_share, predict_any_share
                       over the keystrokes with at least PREDICT_CHARS (8) characters still
                       to type at that point: the share whose top suggestion (any of the k)
                       predicts the next 8 typed characters (`predicts`). What counts is the
                       latest suggestion list on screen before the next keystroke: the
                       request's answer, replaced by a refresh's after a notification
  typeahead_hit_rate   server requests served from its typeahead cache / server requests
                       (keystrokes and refreshes)
  cancelled_share      requests cancelled because the next keystroke came first / requests
  engine_calls         requests the server sent to its engine (warm-up excluded)
  refreshes, refreshed notifications acted on; keystrokes whose suggestions a refresh
                       replaced in time
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lsprotocol import types as lsp
from pygls.io_ import run_async
from pygls.lsp.client import LanguageClient

from kspec.bench.stats import percentile, rounded
from kspec.engine.cache.prefix_cache import common_prefix_length
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.prompt import PromptBudget, PromptStarts, build_prompt
from kspec.engine.serve.runner import EngineFactory, default_engine_factory
from kspec.lsp_server.client_kind import DECLARES_UPDATES
from kspec.lsp_server.server import KspecServer, ServerOptions
from kspec.lsp_server.settings import Settings, camel, parse_settings

log = logging.getLogger("kspec.bench")

PREDICT_CHARS = 8
PAUSE_MS = 500.0  # after a word-ending character (a typist's replay: 10 characters/s with pauses)


def keystroke_times(typed: str, cps: float, pause_ms: float) -> list[float]:
    """Seconds from a point's start at which each character of `typed` is typed: 1/cps
    apart, plus `pause_ms` after each character that is not part of a word."""
    times, at = [], 0.0
    for char in typed:
        times.append(at)
        at += 1 / cps + (pause_ms / 1000 if not (char.isalnum() or char == "_") else 0.0)
    return times
UPDATED_METHOD = "$/kspec/suggestionsUpdated"
# The baseline without the fast CPU path and the answers shaped for a typist: fp32 weights,
# one answer at the deadline, fixed k / maxTokens / debounce / deadline (docs/history.md)
PREVIOUS_SETTINGS: dict[str, Any] = {"dtype": "float32", "firstAnswerMs": 0, "k": 3, "maxTokens": 48, "debounceMs": 40, "deadlineMs": 3000}
PREVIOUS_ENGINE: dict[str, Any] = {"dtype": "float32", "fit_to_machine": False}  # its EngineConfig (fields it lacks are skipped)


def predicts(suggestion: str, still_to_type: str, chars: int = PREDICT_CHARS) -> bool:
    """Does `suggestion` predict the next `chars` characters the user types?

    `still_to_type` is what the user types next at this point, from the source file. True
    when the suggestion's first `chars` characters are exactly those: the suggestion is at
    least `chars` long (a shorter one does not cover them, even if it is right so far) and
    nothing is stripped or normalised (indentation, newlines and trailing spaces count).
    False when fewer than `chars` characters are still to type (such keystrokes are not
    counted at all)."""
    return len(still_to_type) >= chars and suggestion[:chars] == still_to_type[:chars]


def removed_end(text: str, point: int, length: int) -> int:
    """End (exclusive) of the span removed before typing `length` characters from `point`:
    the rest of the line where the typed span ends (its newline stays), or the file's end.
    The user types text[point:point + length] of it; text[point + length:end] is never typed
    in the replay but is still what this user would type next."""
    end = text.find("\n", point + length)
    return end if end != -1 else len(text)


def still_to_type(text: str, point: int, length: int, typed: int) -> str:
    """What the user types next at `point` after `typed` of its `length` characters: the rest
    of the removed span (not the suffix left in the document, which is already there)."""
    return text[point + typed : removed_end(text, point, length)]


@dataclass
class Outcome:
    sent: float
    still_to_type: str = ""
    latency_ms: float | None = None  # set when answered with items in time
    cancelled: bool = False
    closed: bool = False  # the next keystroke came (or the point ended): later answers are not seen
    texts: tuple[str, ...] = ()  # the suggestions on screen for this keystroke
    refreshed: bool = False


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    server_requests: int = 0
    typeahead_hits: int = 0
    engine_calls: int = 0
    refreshes: int = 0

    def summary(self) -> dict[str, Any]:
        latencies = sorted(o.latency_ms for o in self.outcomes if o.latency_ms is not None)
        total = len(self.outcomes)
        counted = [o for o in self.outcomes if len(o.still_to_type) >= PREDICT_CHARS]
        top = sum(bool(o.texts) and predicts(o.texts[0], o.still_to_type) for o in counted)
        any_ = sum(any(predicts(text, o.still_to_type) for text in o.texts) for o in counted)
        return {
            "requests": total,
            "answered": len(latencies),
            "answered_share": _share(len(latencies), total),
            "ttfs_p50_ms": rounded(percentile(latencies, 50)),
            "ttfs_p95_ms": rounded(percentile(latencies, 95)),
            "predict_keystrokes": len(counted),
            "predict_top_share": _share(top, len(counted)),
            "predict_any_share": _share(any_, len(counted)),
            "typeahead_hit_rate": _share(self.typeahead_hits, self.server_requests),
            "cancelled_share": _share(sum(o.cancelled for o in self.outcomes), total),
            "engine_calls": self.engine_calls,
            "refreshes": self.refreshes,
            "refreshed": sum(o.refreshed for o in self.outcomes),
        }


def _share(part: int, whole: int) -> float:
    return round(part / whole, 3) if whole else 0.0


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
        self.state: str | None = None  # the last $/kspec/status state ("loading", "ready", "error")
        self._settled = asyncio.Event()  # set once a state other than "loading" arrives
        self.client.feature("$/kspec/status")(lambda params: self._status(params))
        self.on_updated: dict[str, Callable[[Any], None]] = {}  # uri -> the replay's handler of UPDATED_METHOD
        self.client.feature(UPDATED_METHOD)(lambda params: self._updated(params))  # pygls tags the function: no bound method
        self.client.feature(lsp.WINDOW_SHOW_MESSAGE)(lambda params: log.warning("server: %s", params.message))
        self._stop_reading = threading.Event()  # ends the client's loop over the server's messages
        self._task: asyncio.Task | None = None

    def _status(self, params: Any) -> None:  # on the client's event loop
        self.state = getattr(params, "state", None)
        if self.state not in (None, "loading"):
            self._settled.set()

    async def until_settled(self, timeout_s: float) -> None:
        """Until the engine has loaded and timed the machine (state no longer "loading"): a
        replay that began while it loads would measure the loading."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the engine was still {self.state or 'starting'} after {timeout_s:.0f} s") from None

    def _updated(self, params: Any) -> None:
        handler = self.on_updated.get(getattr(params, "uri", None))  # type: ignore[arg-type]
        if handler is not None:
            handler(params)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self._from_server_r, "rb", buffering=0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(self._to_server_w, "wb", buffering=0))
        self.client.protocol.set_writer(asyncio.StreamWriter(transport, protocol, None, loop))
        self._task = asyncio.ensure_future(run_async(stop_event=self._stop_reading, reader=reader, protocol=self.client.protocol, logger=log))

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 10)
            self.client.exit(None)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("server did not shut down cleanly: %s", exc)
        await asyncio.to_thread(self.thread.join, 30)
        self._stop_reading.set()
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


PREFIX_CHARS = Settings().prefix_chars  # the language server's window before the cursor, by default
COLD_TOKENS = 16  # a keystroke whose prompt shares less than all but this many tokens with the previous one's prefills cold


def prompt_starts(tokenizer: Tokenizer, text: str, points: int, length: int, budget: int, prefix_chars: int = PREFIX_CHARS) -> dict[str, Any]:
    """Typing replayed through the engine's prompt building (no model): at `points` places
    of `text`, `length` characters typed one at a time, each keystroke's prompt built from
    the language server's window (the last `prefix_chars` characters before the cursor) with
    the engine's memory of recent prompt starts, as the engine does. Reported: keystrokes,
    those whose prompt shares less than all but COLD_TOKENS tokens with the previous
    keystroke's (what the prefix cache cannot serve: a cold prefill of the prompt), and the
    mean of the tokens each keystroke computes anew."""
    starts = PromptStarts()
    keystrokes = cold = recomputed = 0
    for point in typing_points(text, points, length):
        document = text[: point] + text[removed_end(text, point, length) :]
        previous: list[int] | None = None
        for typed in range(1, length + 1):
            cursor = point + typed
            current = document[:point] + text[point:cursor]
            ids = build_prompt(tokenizer, current[-prefix_chars:], "", PromptBudget(budget), starts).ids
            if previous is not None:
                shared = common_prefix_length(tuple(previous), ids)
                keystrokes += 1
                recomputed += len(ids) - shared
                cold += len(ids) - shared > COLD_TOKENS
            previous = ids
    return {
        "keystrokes": keystrokes,
        "cold_prompts": cold,
        "cold_share": _share(cold, keystrokes),
        "mean_tokens_recomputed": round(recomputed / keystrokes, 2) if keystrokes else None,
        "budget_tokens": budget,
        "prefix_chars": prefix_chars,
        "points": points,
        "chars_per_point": length,
    }


def _utf16_position(text: str, offset: int) -> lsp.Position:
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return lsp.Position(line=line, character=len(text[start:offset].encode("utf-16-le")) // 2)


@dataclass
class _Keystroke:
    version: int
    position: lsp.Position
    outcome: Outcome
    futures: list[tuple[str, asyncio.Future]] = field(default_factory=list)  # (request id, answer): the request, then refreshes


async def replay_point(
    server: ThreadServer, uri: str, text: str, point: int, length: int, cps: float, pause_ms: float, run: Run, deadline_s: float
) -> None:
    client = server.client
    loop = asyncio.get_running_loop()
    # the line being typed is removed from the point on: the user writes it anew, and the
    # suffix (the following lines) must not already hold the completion the model should make
    document = text[:point] + text[removed_end(text, point, length) :]
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=0, text=document)))
    current: _Keystroke | None = None

    def ask(keystroke: _Keystroke, request_id: str, kind: lsp.InlineCompletionTriggerKind) -> asyncio.Future:
        params = lsp.InlineCompletionParams(
            context=lsp.InlineCompletionContext(trigger_kind=kind), text_document=lsp.TextDocumentIdentifier(uri=uri), position=keystroke.position
        )
        future = asyncio.ensure_future(client.protocol.send_request_async(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=request_id))
        keystroke.futures.append((request_id, future))
        return future

    def refresh(params: Any) -> None:
        """What the editors do on UPDATED_METHOD: ask again if the document is still at that version."""
        keystroke = current
        if keystroke is None or keystroke.outcome.closed or getattr(params, "version", None) != keystroke.version:
            return
        run.refreshes += 1
        future = ask(keystroke, f"{uri}#{keystroke.version}r{len(keystroke.futures)}", lsp.InlineCompletionTriggerKind.Invoked)
        future.add_done_callback(lambda f, o=keystroke.outcome: _record(f, o, loop.time(), refresh=True))

    server.on_updated[uri] = refresh
    start = loop.time()
    schedule = keystroke_times(text[point : point + length], cps, pause_ms)
    try:
        for index in range(length):
            await asyncio.sleep(max(0.0, start + schedule[index] - loop.time()))
            if current is not None:
                _close(client, current)
            char = text[point + index]
            cursor = point + index
            position = _utf16_position(document, cursor)
            document = document[:cursor] + char + document[cursor:]
            change = lsp.TextDocumentContentChangePartial(range=lsp.Range(position, position), text=char)
            client.text_document_did_change(lsp.DidChangeTextDocumentParams(lsp.VersionedTextDocumentIdentifier(uri=uri, version=index + 1), [change]))
            outcome = Outcome(sent=loop.time(), still_to_type=still_to_type(text, point, length, index + 1))
            run.outcomes.append(outcome)
            current = _Keystroke(index + 1, _utf16_position(document, cursor + 1), outcome)
            future = ask(current, f"{uri}#{index}", lsp.InlineCompletionTriggerKind.Automatic)
            future.add_done_callback(lambda f, o=outcome: _record(f, o, loop.time()))
        if current is not None:
            # the last keystroke: its answer counts whenever it comes; a refresh, within
            # the time the next keystroke would have taken
            await asyncio.wait({current.futures[0][1]}, timeout=deadline_s)
            await asyncio.sleep(1 / cps)
            _close(client, current)
    finally:
        server.on_updated.pop(uri, None)
    client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri=uri)))


def _close(client: LanguageClient, keystroke: _Keystroke) -> None:
    """The next keystroke came: what is still pending for this one is cancelled, as an editor does."""
    keystroke.outcome.closed = True
    for number, (request_id, future) in enumerate(keystroke.futures):
        if not future.done():
            if number == 0:
                keystroke.outcome.cancelled = True
            client.cancel_request(lsp.CancelParams(id=request_id))


def _record(future: asyncio.Future, outcome: Outcome, now: float, refresh: bool = False) -> None:
    if future.cancelled() or future.exception() is not None or outcome.closed or (outcome.cancelled and not refresh):
        return
    result = future.result()
    texts = tuple(getattr(item.insert_text, "value", item.insert_text) for item in (result.items if result is not None else ()))
    if not texts:
        return
    outcome.texts = texts
    outcome.refreshed = outcome.refreshed or refresh
    if outcome.latency_ms is None:
        outcome.latency_ms = (now - outcome.sent) * 1000


async def _bench(
    text: str, configurations: dict[str, tuple[EngineFactory, dict[str, Any]]], points: list[int], length: int, cps: float, pause_ms: float
) -> dict[str, Any]:
    servers: dict[str, ThreadServer] = {}
    runs = {name: Run() for name in configurations}
    try:
        for name, (factory, options) in configurations.items():
            server = servers[name] = ThreadServer(ServerOptions(engine="inprocess", engine_factory=factory))
            await server.connect()
            await asyncio.wait_for(server.client.initialize_async(editor_initialize(options)), 60)
            server.client.initialized(lsp.InitializedParams())
        deadline_s = max(parse_settings(options).settings.deadline_ms for _, options in configurations.values()) / 1000 + 5
        for warm in configurations:  # load the models before measuring
            await _warm_up(servers[warm], text, deadline_s * 12)
        for number, point in enumerate(points):
            for name in configurations:  # A B A B: both see the same moments of machine noise
                await replay_point(servers[name], f"file:///bench/{name}/{number}.py", text, point, length, cps, pause_ms, runs[name], deadline_s)
        for name, server in servers.items():
            stats = await asyncio.wait_for(server.client.protocol.send_request_async("kspec/stats", None), 10)
            run = runs[name]  # the warm-up's request and engine call are not counted
            run.server_requests, run.typeahead_hits, run.engine_calls = stats.requests - 1, stats.typeahead_hits, stats.engine_calls - 1
    finally:
        for server in servers.values():
            await server.close()
    return {name: run.summary() for name, run in runs.items()}


def editor_initialize(options: dict[str, Any]) -> lsp.InitializeParams:
    """What our editors send: they re-ask on $/kspec/suggestionsUpdated, so they get early answers
    (a client that does not declare it is a plain client, shown only final answers)."""
    return lsp.InitializeParams(capabilities=lsp.ClientCapabilities(experimental=DECLARES_UPDATES), initialization_options=options)


def known_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the keys this server version knows, the others): unknown keys are reported to the
    user by the server, so a setting that has not landed yet is left out, not sent."""
    known = {key for f in dataclasses.fields(Settings) for key in (f.name, camel(f.name))}
    return {k: v for k, v in settings.items() if k in known}, [k for k in settings if k not in known]


def previous_engine_factory(factory: EngineFactory = default_engine_factory) -> EngineFactory:
    """`factory` with the engine configuration of `PREVIOUS_ENGINE` (those fields EngineConfig has)."""

    def build(config: Any, on_progress: Any) -> Any:
        names = {f.name for f in dataclasses.fields(config)}
        return factory(dataclasses.replace(config, **{k: v for k, v in PREVIOUS_ENGINE.items() if k in names}), on_progress)

    return build


async def _warm_up(server: ThreadServer, text: str, timeout_s: float) -> None:
    await server.until_settled(timeout_s)
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
    pause_ms: float = PAUSE_MS,
    k: int | None = None,
    max_tokens: int | None = None,
    debounce_ms: float | None = None,
    deadline_ms: float | None = None,
    device: str = "cpu",
    raw: bool = False,
    engine_factory: EngineFactory = default_engine_factory,
    previous_factory: EngineFactory | None = None,
    kspec_settings: dict[str, Any] | None = None,
    previous_settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay typing `source` (default: Python's textwrap.py) in both configurations and
    measure; see the module docstring.

    `model`, `k`, `max_tokens`, `debounce_ms`, `deadline_ms`, `device` and `raw` (skip
    trimming: random test models only make garbage, which trimming drops) apply to both
    configurations when given; None leaves each configuration's own value (the server's
    defaults for kspec, `PREVIOUS_SETTINGS` for previous). `previous_factory` defaults to
    `previous_engine_factory(engine_factory)`."""
    path = Path(source) if source is not None else Path(textwrap.__file__)
    text = path.read_text(encoding="utf-8")
    overrides: dict[str, Any] = {"device": device, "raw": raw}
    for key, value in (("model", model), ("k", k), ("maxTokens", max_tokens), ("debounceMs", debounce_ms), ("deadlineMs", deadline_ms)):
        if value is not None:
            overrides[key] = value
    sent, not_sent = {}, {}
    for name, base in (("kspec", kspec_settings or {}), ("previous", PREVIOUS_SETTINGS if previous_settings is None else previous_settings)):
        sent[name], not_sent[name] = known_settings({**base, **overrides})
    configurations = {
        "kspec": (engine_factory, sent["kspec"]),
        "previous": (previous_factory or previous_engine_factory(engine_factory), sent["previous"]),
    }
    started = time.perf_counter()
    report: dict[str, Any] = asyncio.run(_bench(text, configurations, typing_points(text, points, chars_per_point), chars_per_point, cps, pause_ms))
    report.update(
        {
            "settings": {**sent, "not_sent": not_sent},
            "source": str(path),
            "points": points,
            "chars_per_point": chars_per_point,
            "cps": cps,
            "pause_ms": pause_ms,
            "predict_chars": PREDICT_CHARS,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    )
    return report
