"""The kspec language server (pygls 2): inline completions from a warm engine.

One `Session` per client connection owns the documents, settings, typeahead cache,
in-flight requests and the engine client; each LSP feature is one method. A request:

  position -> cursor context (budgets) -> typeahead hit? answer now
           -> the user typed what a branch of the document's request still decoding has
              written the start of? wait for its next rounds: typeahead hit? answer
           -> supersede the document's older request -> debounce (automatic triggers)
           -> engine, raced against being superseded and against the deadline
           -> items whose ranges replace what they repeat right of the cursor.

For a client that declared `$/kspec/suggestionsUpdated` (client_kind.py), every interim
answer of the engine (from the first-answer moment on, each round that grew the branches)
goes into the typeahead cache; any other client waits for whole answers. A request's engine work outlives the request
when the client cancels it (an editor cancels the previous request at every keystroke): it
goes on, into the typeahead cache, until a request it cannot serve supersedes it or its
deadline passes.

Nothing here holds a lock; `didChange` only edits the document; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.errors import InputError, KspecError
from kspec.engine.version import version
from kspec.lsp_server.acceptance import ACCEPT_COMMAND, Acceptance, item_command
from kspec.lsp_server.client_kind import handles_updates, whole_texts
from kspec.lsp_server.progress import LoadingProgress, client_shows_progress
from kspec.lsp_server.context import Budgets, EditorContext, editor_context, looks_binary
from kspec.lsp_server.documents import ENCODINGS, MAX_DOCUMENT_CHARS, UTF16, Cursor, Document, DocumentStore, line_body, units_from_column
from kspec.lsp_server.edits import CLOSERS, replaced_chars
from kspec.lsp_server.engine_client import DAEMON_IDLE_TIMEOUT_S, DaemonEngine, DaemonOptions, EngineClient, InProcessEngine, UnusableEngine
from kspec.lsp_server.jsonrpc import MAX_MESSAGE_BYTES, ChunkReader, Dispatcher, Frame, frames_to_loop, read_frames, strict_converter
from kspec.engine.config import EngineConfig
from kspec.engine.serve.protocol import parse_engine_url
from kspec.lsp_server.remote_backend import OpenAIEngine, RemoteOptions, api_key_from
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable
from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.runner import EngineFactory, default_engine_factory
from kspec.engine.serve.status import ERROR, READY, Status
from kspec.lsp_server.settings import SECTION, Settings, parse_settings
from kspec.lsp_server.tcp_admission import Limits, admit
from kspec.lsp_server.typeahead import Entry, TypeaheadCache, typed_since

log = logging.getLogger("kspec.lsp")

VERSION = version()  # pyproject.toml, through the installed distribution
STATUS_METHOD = "$/kspec/status"
STATS_METHOD = "kspec/stats"
UPDATED_METHOD = "$/kspec/suggestionsUpdated"  # longer alternatives for {uri, version} are in the typeahead cache
FALLBACK_FIRST_ANSWER_MS = 300.0  # when the engine chose none (a remote engine) and the user set none
MID_LINE_MAX_TOKENS = 24  # a cursor before text on its line only completes that line
ENGINE_GRACE_S = 0.5  # on top of the request's deadline, for the engine to return what it has
INTERIM_REFRESH_MS = 300.0  # after an early answer, the client is told of grown alternatives at most this often
CONFIGURATION_TIMEOUT_S = 5.0
# `activity` in $/kspec/status: what the user's last request is doing, so that "nothing
# came" (IDLE, no item) can be told from "still working" and "gave up at the deadline"
IDLE, BUSY, TIMED_OUT = "idle", "busy", "timedOut"
EXIT_JOIN_S = 3.0  # at exit, for the engine thread to leave torch code


class Redactor(logging.Filter):
    """Drops the arguments of pygls' log records (they carry message bodies) unless debugging."""

    def __init__(self, debug: bool = False):
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.debug and record.name.startswith("pygls") and record.args:
            hidden = _PLACEHOLDER.sub(lambda match: "%" if match.group() == "%%" else "…", str(record.msg))
            record.msg, record.args = f"{hidden} (arguments hidden; enable debugLog)", ()
        return True


_PLACEHOLDER = re.compile(r"%%|%(\([^)]*\))?[-#0 +]*(\d+|\*)?(\.(\d+|\*))?[diouxXeEfFgGcrsa]")  # printf-style, as logging formats


@dataclass(frozen=True)
class ServerOptions:
    engine: str | None = None  # forces the placement ("inprocess", "daemon", "remote", "openai"); None: the setting decides
    engine_factory: EngineFactory = default_engine_factory  # in-process engines (benchmarks swap it)
    daemon_folder: Path | None = None
    daemon_idle_timeout_s: float = DAEMON_IDLE_TIMEOUT_S
    engine_url: str | None = None  # forces the engine URL (`kspec lsp --engine-url`); None: the setting decides
    daemon_token: str | None = None  # forces the network engine's token
    allow_insecure_remote: bool = False  # `kspec lsp --allow-insecure-remote`: as the setting allowInsecureRemote
    redactor: Redactor = field(default_factory=Redactor)
    max_message_bytes: int = MAX_MESSAGE_BYTES


@dataclass
class Stats:
    requests: int = 0
    answered: int = 0  # with at least one item
    empty: int = 0
    typeahead_hits: int = 0
    engine_calls: int = 0
    superseded: int = 0  # dropped for a newer request on the same document
    cancelled: int = 0  # $/cancelRequest
    timeouts: int = 0  # no answer by the deadline (also: the engine's answer came back empty at it)
    errors: int = 0
    early_answers: int = 0  # answered at the first-answer moment while decoding went on
    continued: int = 0  # of those, final answers stored in the typeahead cache (client told)
    interim_updates: int = 0  # of those, interim answers that grew the alternatives meanwhile (client told)
    joined: int = 0  # waited for the next rounds of an older request whose branches they continue
    unattended: int = 0  # engine work that went on after its request was cancelled
    work_on: int = 0  # now: requests whose engine work goes on after their early answer or cancellation


@dataclass(frozen=True)
class Query:
    document: Document
    cursor: Cursor
    body: str  # the cursor's line at request time, without its terminator
    context: EditorContext
    settings: Settings
    version: int  # the document's version at request time


class Ticket:
    """The newest request of a document with the engine; set `superseded` when a newer one
    arrives that it cannot serve. While the engine decodes for it, `texts` are its latest
    interim alternatives (None before the first), and `grew` is set each time they change
    and when its engine work is over."""

    def __init__(self, query: Query | None = None) -> None:
        self.superseded = asyncio.Event()
        self.query = query
        self.texts: tuple[str, ...] | None = None
        self.over = False
        self.grew = asyncio.Event()
        self.unattended: asyncio.Future | None = None  # its engine work, going on after it was cancelled

    def interim(self, texts: tuple[str, ...]) -> None:
        self.texts = texts
        self._wake()

    def finish(self) -> None:
        self.over = True
        self._wake()

    def supersede(self) -> None:
        """A newer request it cannot serve came (or its document closed): its engine work stops."""
        self.superseded.set()
        self.finish()

    def _wake(self) -> None:
        grew, self.grew = self.grew, asyncio.Event()
        grew.set()

    def may_still_write(self, query: Query) -> bool:
        """Still decoding, and `query` is its place with text typed at the cursor that some
        branch has written the start of and no further: its next interim answer may serve it."""
        mine = self.query
        if mine is None or self.texts is None or self.over or self.superseded.is_set() or mine.settings != query.settings:
            return False
        found = typed_since(mine.context, query.context, query.settings.prefix_chars, query.settings.suffix_chars)
        return found is not None and any(found[0].startswith(text) for text in self.texts)


class KspecProtocol(LanguageServerProtocol):
    """pygls' protocol without its own copy of every document (we keep ours, line-based),
    and without its leak of finished handlers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handling: set[Any] = set()  # ids of the client's requests (and notifications) whose handlers run

    def _execute_handler(self, msg_id: Any, handler: Callable, callback: Callable, args: Any = None, kwargs: Any = None) -> None:
        """pygls 2.1 files the future of a generator or async handler under `msg_id` (a fresh
        uuid for notifications and for each step of a generator) and only a request's answer
        removes it: every didOpen/didChange/didClose kept ~1.9 KB for good. Each is removed
        when its handler finishes (a request's first, by pygls, when it is answered)."""

        def finished(future: Any) -> None:
            try:
                callback(future)
            finally:
                self._handling.discard(msg_id)
                if self._request_futures.get(msg_id) is future:
                    del self._request_futures[msg_id]

        self._handling.add(msg_id)
        super()._execute_handler(msg_id, handler, finished, args, kwargs)

    def _handle_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        """A "response" whose id is one of the client's own requests still being handled
        (pygls keeps both in one table) is the client's mistake: one line, and the request
        goes on (pygls would hand it to the handler's task: a RuntimeError traceback)."""
        if msg_id in self._handling:
            log.warning("ignoring a response with id %r: that is the id of the client's own request in progress", msg_id)
            return
        super()._handle_response(msg_id, result, error)

    def _send_handler_result(self, future: Any, *, msg_id: Any) -> None:
        """A request the client got wrong (Invalid Params: a position outside the document)
        is answered with one log line; pygls would log a traceback at ERROR and show it."""
        error = None if future.cancelled() else future.exception()
        if not isinstance(error, JsonRpcInvalidParams):
            super()._send_handler_result(future, msg_id=msg_id)
            return
        self._request_futures.pop(msg_id, None)
        log.warning("invalid params for request %s: %s", msg_id, error.message)
        self._send_response(msg_id, error=error.to_response_error())

    @lsp_method(lsp.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: lsp.DidOpenTextDocumentParams):
        if (handler := self.fm.features.get(lsp.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield handler, (params,), None

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: lsp.DidChangeTextDocumentParams):
        if (handler := self.fm.features.get(lsp.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield handler, (params,), None

    @lsp_method(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: lsp.DidCloseTextDocumentParams):
        if (handler := self.fm.features.get(lsp.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield handler, (params,), None


def negotiate_encoding(capabilities: lsp.ClientCapabilities) -> str:
    """The client's first offered encoding we support (as pygls advertises it); else UTF-16."""
    offered = capabilities.general.position_encodings if capabilities.general else None
    for encoding in offered or ():
        value = getattr(encoding, "value", encoding)
        if value in ENCODINGS:
            return value
    return UTF16


def short_label(text: str, width: int = 40) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    label = lines[0] if lines else text.strip()
    if len(label) > width:
        return label[: width - 1] + "…"
    return label + (" …" if len(lines) > 1 else "")


class Session:
    def __init__(self, server: "KspecServer", options: ServerOptions):
        self.server = server
        self.options = options
        self.documents = DocumentStore()
        self.settings = Settings() if options.engine is None else Settings(engine=options.engine)
        self.typeahead = TypeaheadCache()
        self.stats = Stats()
        self.acceptance = Acceptance()  # shown / accepted / partially accepted, by rank and language
        self.loading: LoadingProgress | None = None  # $/progress while the model loads (set at initialize)
        self.encoding = UTF16
        self.engine: EngineClient | None = None
        self._retired: list[EngineClient] = []  # closed engines whose thread may still be finishing
        self._engine_key: tuple[Any, ...] | None = None
        self._load_slot = LoadSlot()  # one in-process engine loads (or lives) at a time: a storm of model changes loads the last
        self._generation = 0  # of self.engine: statuses of the engines it replaced are dropped
        self._inflight: dict[str, Ticket] = {}
        self._legacy_trigger_kinds = False
        self._handles_updates = False  # the client declared $/kspec/suggestionsUpdated: early answers for it
        self._pending_problems: list[str] = []
        self._shown: set[str] = set()  # user messages already shown since the engine was last ready
        self._status = Status("loading", "starting")
        self._activity = IDLE  # of the requests with the engine: BUSY while any is, else how the last ended
        self._busy = 0  # requests with the engine now
        self._closed = False
        self._user_set: set[str] = set()  # settings the client gave; the engine's machine defaults fill the rest

    def register(self) -> None:
        def feature(name: str, options: Any = None) -> Callable[[Callable], None]:
            return lambda method: self.server.feature(name, options)(_as_function(method))

        feature(lsp.INITIALIZE)(self.initialize)
        feature(lsp.INITIALIZED)(self.initialized)
        feature(lsp.SHUTDOWN)(self.shutdown)
        feature(lsp.EXIT)(self.exit)
        feature(lsp.TEXT_DOCUMENT_DID_OPEN)(self.did_open)
        feature(lsp.TEXT_DOCUMENT_DID_CHANGE)(self.did_change)
        feature(lsp.TEXT_DOCUMENT_DID_CLOSE)(self.did_close)
        feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)(self.did_change_configuration)
        feature(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, lsp.InlineCompletionOptions())(self.inline_completion)
        feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(resolve_provider=False))(self.completion)
        feature(STATS_METHOD)(self.stats_request)
        self.server.command(ACCEPT_COMMAND)(lambda *arguments: self.accepted(arguments))

    # --- lifecycle -------------------------------------------------------------------

    def initialize(self, params: lsp.InitializeParams) -> None:
        self.encoding = negotiate_encoding(params.capabilities)
        self._handles_updates = handles_updates(params.capabilities.experimental)
        self.loading = LoadingProgress(self.server.work_done_progress, client_shows_progress(params.capabilities))
        parsed = parse_settings(params.initialization_options, self.settings)
        self._user_set = (self._user_set - parsed.cleared) | parsed.given
        self._set_settings(parsed.settings)
        self._pending_problems = parsed.problems
        log.info("initialized: position encoding %s, engine %s", self.encoding, self.settings.engine)

    def initialized(self, params: lsp.InitializedParams) -> None:
        for problem in self._pending_problems:
            self.show(f"kspec: {problem}", lsp.MessageType.Warning)
        self._pending_problems = []
        self._ensure_engine()

    def shutdown(self, params: None) -> None:
        self.close()

    def exit(self, params: None) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ticket in self._inflight.values():
            ticket.supersede()
        if self.engine is not None:
            self.engine.close()

    # --- documents ---------------------------------------------------------------------

    def did_open(self, params: lsp.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        document = self.documents.open(item.uri, item.language_id, item.version, item.text)
        self.typeahead.forget(item.uri)
        if document.too_large:
            self._too_large(document)

    def did_change(self, params: lsp.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        if uri not in self.documents:
            log.warning("didChange for a document that is not open (ignored)")
            return
        document = self.documents.get(uri)
        for change in params.content_changes:
            if isinstance(change, lsp.TextDocumentContentChangePartial):
                if document.too_large:
                    continue
                start = document.clamped_cursor(change.range.start.line, change.range.start.character, self.encoding)
                end = document.clamped_cursor(change.range.end.line, change.range.end.character, self.encoding)
                document.apply_edit(start, end, change.text)
            else:
                document.replace_all(change.text)
            if document.too_large:
                self._too_large(document)
        document.version = params.text_document.version

    def did_close(self, params: lsp.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        self.documents.close(uri)
        self.typeahead.forget(uri)
        ticket = self._inflight.pop(uri, None)
        if ticket is not None:
            ticket.supersede()

    def _engines(self) -> list[EngineClient]:
        return self._retired + ([self.engine] if self.engine else [])

    def join(self, timeout_s: float) -> None:
        for engine in self._engines():
            if not engine.join(timeout_s):
                log.warning("the engine did not stop within %.1f s", timeout_s)

    def _too_large(self, document: Document) -> None:
        self.show(f"kspec: {document.uri} is too large for completions (over {MAX_DOCUMENT_CHARS} characters)", lsp.MessageType.Warning)

    # --- settings ----------------------------------------------------------------------

    async def did_change_configuration(self, params: lsp.DidChangeConfigurationParams) -> None:
        raw = params.settings
        if not raw and self._client_pulls_configuration():
            raw = await self._pull_configuration()
        parsed = parse_settings(raw, self.settings)
        self._user_set = (self._user_set - parsed.cleared) | parsed.given
        for problem in parsed.problems:
            self.show(f"kspec: {problem}", lsp.MessageType.Warning)
        self._set_settings(parsed.settings)
        self._ensure_engine()

    def _client_pulls_configuration(self) -> bool:
        workspace = self.server.client_capabilities.workspace
        return bool(workspace and workspace.configuration)

    async def _pull_configuration(self) -> Any:
        request = lsp.ConfigurationParams(items=[lsp.ConfigurationItem(section=SECTION)])
        try:
            values = await asyncio.wait_for(self.server.workspace_configuration_async(request), CONFIGURATION_TIMEOUT_S)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("workspace/configuration failed: %s", type(exc).__name__)
            return None
        return values[0] if values else None

    def _set_settings(self, settings: Settings) -> None:
        if self.options.engine is not None and settings.engine != self.options.engine:
            settings = replace(settings, engine=self.options.engine)
        if settings != self.settings:
            self.typeahead.clear()  # suggestions made under other settings (k, max tokens, mode, model)
        self.settings = settings
        self.options.redactor.debug = settings.debug_log

    def _ensure_engine(self) -> None:
        if self._closed:
            return
        key = self.settings.engine_key()
        if self.engine is not None and key == self._engine_key:
            return
        if self.engine is not None:
            self.engine.close()
            self._retired = [e for e in self._retired if not e.join(0)] + [self.engine]
            self.typeahead.clear()  # another model's suggestions
        self._engine_key = key
        self._shown.clear()
        self._generation += 1
        self.engine = self._make_engine(self.settings, self._status_of(self._generation))
        self._status = self.engine.status  # the replaced engine's (its model, "ready") must not be told again
        asyncio.ensure_future(self.engine.start())

    def _make_engine(self, settings: Settings, on_status: Callable[[Status], None]) -> EngineClient:
        config = settings.engine_config()
        if settings.engine == "inprocess":
            return InProcessEngine(config, on_status, self.options.engine_factory, self._load_slot)
        if settings.engine == "daemon":
            options = DaemonOptions(config=config, folder=self.options.daemon_folder, idle_timeout_s=self.options.daemon_idle_timeout_s)
            return DaemonEngine(options, on_status)
        try:
            return self._network_engine(settings, config, on_status)
        except (ValueError, InputError) as exc:
            return UnusableEngine(f"engine {settings.engine!r}: {exc}", on_status)

    def _status_of(self, generation: int) -> Callable[[Status], None]:
        """The status callback of the engine of `generation`: silent once it was replaced."""

        def on_status(status: Status) -> None:
            if generation == self._generation:
                self._on_status(status)

        return on_status

    def _network_engine(self, settings: Settings, config: EngineConfig, on_status: Callable[[Status], None]) -> EngineClient:
        """A kspec engine on the network ("remote") or an OpenAI-compatible one ("openai").
        Raises ValueError / InputError for settings that cannot work (no URL, wrong scheme, no token file)."""
        text = self.options.engine_url or settings.engine_url
        if not text:
            raise ValueError("set engineUrl (tcp://HOST:PORT or tls://HOST:PORT for a kspec engine, http(s)://HOST:PORT/v1 for an OpenAI-compatible one)")
        url = parse_engine_url(text)
        if url.in_clear_off_machine and not (settings.allow_insecure_remote or self.options.allow_insecure_remote):
            raise ValueError(
                f"{url} would carry your code{' and API key' if settings.engine == 'openai' else ' and token'} unencrypted to another machine; "
                "use https:// or tls://, or, on a network you trust, set allowInsecureRemote to true in your user settings "
                "(or pass --allow-insecure-remote to kspec lsp)"
            )
        variables = ("KSPEC_ENGINE_TOKEN", "OPENAI_API_KEY") if settings.engine == "openai" else ("KSPEC_ENGINE_TOKEN",)
        token = self.options.daemon_token or api_key_from(settings.engine_token_file, variables)
        ca_file = Path(settings.engine_ca_file).expanduser() if settings.engine_ca_file else None
        sent = "the text around your cursor" + (" and the API key" if token and settings.engine == "openai" else "")
        self.show(f"kspec: completions send {sent} to {url.host}:{url.port} (engine {settings.engine!r}, {url})", lsp.MessageType.Info)
        if settings.engine == "openai":
            return OpenAIEngine(RemoteOptions(url, settings.remote_model, token, ca_file, settings.remote_fim), on_status)
        if url.is_http:
            raise ValueError(f"{url} is an HTTP URL: use engine 'openai' for it, or tcp:// / tls:// for a kspec engine")
        if not token:
            raise ValueError("a network engine needs its token: set engineTokenFile or $KSPEC_ENGINE_TOKEN")
        options = DaemonOptions(config=config, url=url, token=token, ca_file=ca_file, connect_timeout_s=10.0)
        return DaemonEngine(options, on_status)

    # --- status and messages ---------------------------------------------------------

    def _on_status(self, status: Status) -> None:
        self._status = status
        if self.loading is not None and not self._closed:
            self.loading.update(status)
        if status.state == READY:
            self._shown.clear()
        elif status.state == ERROR:
            self.show(f"kspec: {status.message}", lsp.MessageType.Error)
        self.notify_status(status)

    def notify_status(self, status: Status) -> None:
        """The engine's status, with this server's pid, the engine daemon's log file (when
        there is one) and what the requests are doing (`activity`)."""
        if self._closed:
            return
        data = {**status.to_dict(), "serverPid": os.getpid(), "activity": self._activity, "acceptance": self.acceptance.summary()}
        log_file = getattr(self.engine, "log_file", None)
        if log_file is not None:
            data["logFile"] = str(log_file)
        self.server.protocol.notify(STATUS_METHOD, data)

    def _set_activity(self, activity: str) -> None:
        """BUSY while a request is with the engine; told to the client when it changes."""
        activity = BUSY if self._busy > 0 else activity
        if activity != self._activity:
            self._activity = activity
            self.notify_status(self._status)

    def show(self, message: str, kind: lsp.MessageType) -> None:
        """A user-visible message, once until the engine is ready again."""
        if message in self._shown:
            return
        self._shown.add(message)
        log.warning("%s", message)
        self.server.window_show_message(lsp.ShowMessageParams(type=kind, message=message))

    def stats_request(self, params: Any) -> dict[str, Any]:
        return {
            **asdict(self.stats),
            "documents": len(self.documents),
            "typeahead_entries": len(self.typeahead),
            "inflight": len(self._inflight),
            "handlers": len(self.server.protocol._request_futures),  # running handlers (pygls' book of them)
            "engine_threads": sum(not engine.join(0) for engine in self._engines()),
            "acceptance": self.acceptance.to_dict(),
        }

    def accepted(self, arguments: tuple[Any, ...]) -> None:
        """`kspec.accepted` (an item's command, or the client's own accept notice): counted, never logged with text."""
        for argument in arguments:
            problem = self.acceptance.accepted(argument)
            if problem:
                log.warning("%s: %s", ACCEPT_COMMAND, problem)
                return
        if arguments:
            self.notify_status(self._status)

    # --- completions -------------------------------------------------------------------

    def normalize(self, message: dict[str, Any]) -> None:
        """Accept both inline-completion trigger-kind numberings before validation.

        LSP 3.18 says Invoked = 1, Automatic = 2; older clients (the proposed API) sent
        Invoked = 0, Automatic = 1. A client that ever sends 0 uses the old numbering, so
        its 1 means Automatic. A missing context means Invoked."""
        if message.get("method") != lsp.TEXT_DOCUMENT_INLINE_COMPLETION or not isinstance(message.get("params"), dict):
            return
        params = message["params"]
        context = params.setdefault("context", {"triggerKind": 1})
        if not isinstance(context, dict):
            return
        kind = context.setdefault("triggerKind", 1)
        if kind == 0:
            self._legacy_trigger_kinds = True
            context["triggerKind"] = 1
        elif kind == 1 and self._legacy_trigger_kinds:
            context["triggerKind"] = 2

    async def inline_completion(self, params: lsp.InlineCompletionParams) -> lsp.InlineCompletionList:
        automatic = params.context.trigger_kind == lsp.InlineCompletionTriggerKind.Automatic
        query = self._query(params.text_document.uri, params.position)
        texts = await self._suggest(query, debounce=automatic) if query else []
        items = [
            lsp.InlineCompletionItem(insert_text=text, range=self._edit_range(query, text), command=item_command(rank, query.document.language_id, text))
            for rank, text in enumerate(texts)
            if query
        ]
        if items and query:
            self.acceptance.shown(query.document.language_id, len(items))
        return lsp.InlineCompletionList(items=items)

    async def completion(self, params: lsp.CompletionParams) -> lsp.CompletionList:
        query = self._query(params.text_document.uri, params.position)
        texts = await self._suggest(query, debounce=True) if query else []
        items = []
        for index, text in enumerate(texts):
            assert query is not None
            items.append(
                lsp.CompletionItem(
                    label=short_label(text),
                    kind=lsp.CompletionItemKind.Text,
                    detail="kspec",
                    documentation=self._documentation(query, text),
                    sort_text=f"{index:04d}",
                    filter_text=text,
                    preselect=index == 0,
                    insert_text_format=lsp.InsertTextFormat.PlainText,
                    text_edit=lsp.TextEdit(range=self._edit_range(query, text), new_text=text),
                    command=item_command(index, query.document.language_id, text),
                )
            )
        if items and query:
            self.acceptance.shown(query.document.language_id, len(items))
        return lsp.CompletionList(is_incomplete=True, items=items)

    def _documentation(self, query: Query, text: str) -> lsp.MarkupContent | str:
        """The whole suggestion, as Markdown when the client says it renders it."""
        capabilities = self.server.client_capabilities.text_document
        completion = capabilities.completion.completion_item if capabilities and capabilities.completion else None
        if completion and lsp.MarkupKind.Markdown in (completion.documentation_format or ()):
            return lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=f"```{query.document.language_id}\n{text}\n```")
        return text

    def _query(self, uri: str, position: lsp.Position) -> Query | None:
        """The request's context, None when this document gets no completions, InvalidParams for bad input."""
        self.stats.requests += 1
        try:
            document = self.documents.get(uri)
            if document.too_large:
                return None
            cursor = document.cursor(position.line, position.character, self.encoding)
        except InputError as exc:
            self.stats.errors += 1
            raise JsonRpcInvalidParams(str(exc)) from None
        settings = self.settings
        if not settings.language_enabled(document.language_id):
            return None
        context = editor_context(document, cursor, Budgets(settings.prefix_chars, settings.suffix_chars))
        if looks_binary(context):
            self.show(f"kspec: {uri} looks binary (NUL characters); no completions there", lsp.MessageType.Info)
            return None
        return Query(document, cursor, line_body(document.lines[cursor.line]), context, settings, document.version)

    def _edit_range(self, query: Query | None, text: str) -> lsp.Range:
        assert query is not None
        column = query.cursor.column
        end = column + replaced_chars(text, query.context.line_suffix)
        line = query.cursor.line
        return lsp.Range(
            start=lsp.Position(line=line, character=units_from_column(query.body, column, self.encoding)),
            end=lsp.Position(line=line, character=units_from_column(query.body, end, self.encoding)),
        )

    def _cached(self, query: Query) -> list[str] | None:
        """The typeahead cache's answer, if it has one."""
        settings = query.settings
        if not settings.typeahead:
            return None
        hit = self.typeahead.lookup(query.document.uri, query.context, settings.prefix_chars, settings.suffix_chars)
        if hit is None:
            return None
        self.stats.typeahead_hits += 1
        self.stats.answered += 1
        self._set_activity(IDLE)
        return list(hit.texts[: self._choice("k", settings.k)])

    async def _suggest(self, query: Query, debounce: bool) -> list[str]:
        settings, uri = query.settings, query.document.uri
        if (texts := self._cached(query)) is not None:
            return texts
        pending = self._inflight.get(uri)
        if settings.typeahead and pending is not None and pending.may_still_write(query):
            # The user typed what a branch of the request decoding on has begun to write:
            # its next rounds may serve this one, sooner than starting over would.
            self.stats.joined += 1
            try:
                while pending.may_still_write(query):
                    await asyncio.wait_for(pending.grew.wait(), settings.deadline_ms / 1000 + ENGINE_GRACE_S)
                    if (texts := self._cached(query)) is not None:
                        return texts
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                self.stats.cancelled += 1
                raise
        ticket = self._begin(uri, query)
        continuing: asyncio.Future | None = None
        try:
            if debounce and settings.debounce_ms > 0:
                superseded = asyncio.ensure_future(ticket.superseded.wait())
                try:
                    done, _ = await asyncio.wait({superseded}, timeout=settings.debounce_ms / 1000)
                finally:
                    superseded.cancel()
                if done:
                    self.stats.superseded += 1
                    return []
            texts, continuing = await self._ask_engine(query, ticket)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            raise
        finally:
            continuing = continuing or ticket.unattended
            if continuing is None:
                self._end(uri, ticket)
            else:  # the request decodes on after its answer or its cancelling: a diverging request still supersedes it
                continuing.add_done_callback(lambda _: self._end(uri, ticket))
        if texts:
            self.stats.answered += 1
        else:
            self.stats.empty += 1
        return texts

    def _choice(self, name: str, value: Any) -> Any:
        """A setting's value: the user's when given, else what the engine chose for this machine."""
        defaults = self._status.defaults  # MachineDefaults.to_dict(): k, max_tokens, first_answer_ms, ...
        chosen = defaults.get(name) if defaults and name not in self._user_set else None
        if chosen is None:
            return value
        return int(chosen) if isinstance(value, int) else chosen

    def _request(self, query: Query) -> CompletionRequest:
        settings, context = query.settings, query.context
        max_tokens = self._choice("max_tokens", settings.max_tokens)
        first_answer = self._choice("first_answer_ms", settings.first_answer_ms)
        if first_answer is None:
            first_answer = FALLBACK_FIRST_ANSWER_MS
        if any(char not in CLOSERS for char in context.line_suffix):
            max_tokens = min(max_tokens, MID_LINE_MAX_TOKENS)  # text right of the cursor: only the rest of this line
            first_answer = 0.0  # such a short request answers once, when done
        return CompletionRequest(
            prefix=context.prefix,
            suffix=context.suffix,
            language=query.document.language_id,
            path=_uri_path(query.document.uri),
            k=self._choice("k", settings.k),
            max_tokens=max_tokens,
            mode=settings.mode,
            temperature=settings.temperature,
            deadline_ms=settings.deadline_ms,
            first_answer_ms=min(first_answer, settings.deadline_ms) if settings.typeahead and self._handles_updates else 0.0,
            raw=settings.raw,
        )

    async def _ask_engine(self, query: Query, ticket: Ticket) -> tuple[list[str], asyncio.Future | None]:
        """The texts to show now, and the request still decoding after an early answer (its
        final answer lands in the typeahead cache), if any."""
        settings, context = query.settings, query.context
        if self.engine is None:
            self._ensure_engine()
        engine = self.engine
        if engine is None:
            return [], None
        request = self._request(query)
        if settings.debug_log:
            log.debug("request at %s:%d: ...%r | %r...", query.document.uri, query.cursor.line, context.prefix[-80:], context.suffix[:40])
        self.stats.engine_calls += 1
        started = time.perf_counter()
        early: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_interim(interim: CompletionResult) -> None:
            # Every interim answer (the branches grew) serves the keystrokes that follow.
            if not ticket.superseded.is_set():
                ticket.interim(tuple(self._store(query, interim, started, shown=False)))
            if not early.done():
                early.set_result(interim)

        job = asyncio.ensure_future(engine.complete(request, on_interim if request.first_answer_ms > 0 else None))
        job.add_done_callback(_retrieved)  # superseded or shut down, nobody may read its error
        superseded = asyncio.ensure_future(ticket.superseded.wait())
        done: set[asyncio.Future] = set()
        self._busy += 1
        self._set_activity(BUSY)
        outcome = IDLE  # told when this request is over (also when it was cancelled)
        try:
            try:
                done, _ = await asyncio.wait({job, early, superseded}, timeout=settings.deadline_ms / 1000 + ENGINE_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                # The client cancelled: an editor does at every keystroke, and the next request
                # may continue this one. The engine goes on for it, unattended.
                if not job.done() and not ticket.superseded.is_set():
                    ticket.unattended = asyncio.ensure_future(self._unattended(query, request, ticket, job, early, started))
                raise
            finally:
                self._busy -= 1
                superseded.cancel()
                if ticket.unattended is None and not done & {job, early} and not job.done():
                    job.cancel()  # stops the engine at its next round
            if job in done:
                texts = self._answered(query, request, job, started)
                if not texts and _timed_out(job, started, request.deadline_ms):
                    self.stats.timeouts += 1
                    outcome = TIMED_OUT
                return texts, None
            if early in done:
                texts = self._store(query, early.result(), started, kept=True)
                self.stats.early_answers += 1
                return texts[: request.k], asyncio.ensure_future(self._decode_on(query, request, ticket, job, started))
            if superseded in done:
                self.stats.superseded += 1
            else:
                self.stats.timeouts += 1
                outcome = TIMED_OUT
                log.info("no answer within deadlineMs (%.0f ms)", settings.deadline_ms)
            return [], None
        finally:
            self._set_activity(outcome)

    def _answered(self, query: Query, request: CompletionRequest, job: asyncio.Future, started: float, shown: bool = True) -> list[str]:
        try:
            result = job.result()
        except (DeadlineExceeded, EngineUnavailable, KspecError) as exc:
            self.stats.errors += 1
            log.info("no completion: %s", exc)
            return []
        return self._store(query, result, started, shown)[: request.k]

    def _store(self, query: Query, result: CompletionResult, started: float, shown: bool = True, kept: bool = False) -> list[str]:
        """Texts of an answer, kept in the typeahead cache (unless `kept` there already); the
        status carries its latency when it is the answer the user waited for (`shown`), not
        one decoded on after it."""
        settings = query.settings
        texts = [c.text for c in result.completions if c.text] if self._handles_updates else whole_texts(result.completions)
        if texts and settings.typeahead and not kept:
            self.typeahead.store(query.document.uri, Entry(query.context, settings.prefix_chars, settings.suffix_chars, tuple(texts)))
        if not shown:
            return texts
        latency_ms = (time.perf_counter() - started) * 1000
        self._activity = BUSY if self._busy > 0 else IDLE  # told with the latency below
        self._status = replace(self._status, state=READY, message="ready", model=result.model, latency_ms=latency_ms)
        self.notify_status(self._status)
        return texts

    async def _decode_on(self, query: Query, request: CompletionRequest, ticket: Ticket, job: asyncio.Future, started: float) -> None:
        """After an early answer: the interim answers that grew the alternatives, at most one
        per `INTERIM_REFRESH_MS`, and the final answer go into the typeahead cache and the
        client is told (it asks again and gets the longer alternatives at once: the
        suggestion grows while the user pauses); a request for this document that the
        typeahead cache cannot answer supersedes (cancels) it."""
        with self._engine_work_on():
            superseded = asyncio.ensure_future(ticket.superseded.wait())
            ends = time.perf_counter() + request.deadline_ms / 1000 + ENGINE_GRACE_S
            told = time.perf_counter()
            done: set[asyncio.Future] = set()
            try:
                while True:
                    grew = asyncio.ensure_future(ticket.grew.wait())
                    try:
                        done, _ = await asyncio.wait({job, superseded, grew}, timeout=max(0.0, ends - time.perf_counter()), return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        grew.cancel()
                    if grew not in done or job in done or superseded in done:
                        break
                    if (time.perf_counter() - told) * 1000 >= INTERIM_REFRESH_MS and not self._closed:
                        told = time.perf_counter()
                        self.stats.interim_updates += 1
                        self._tell_updated(query)
            finally:
                superseded.cancel()
                if not job.done():
                    job.cancel()
            if superseded in done and job not in done:
                self.stats.superseded += 1
            if job not in done or job.cancelled() or job.exception() is not None:
                return
            if self._answered(query, request, job, started, shown=False) and not self._closed:
                self.stats.continued += 1
                self._tell_updated(query)

    def _tell_updated(self, query: Query) -> None:
        """Longer alternatives for the document at the request's version are in the typeahead cache."""
        self.server.protocol.notify(UPDATED_METHOD, {"uri": query.document.uri, "version": query.version})

    async def _unattended(
        self, query: Query, request: CompletionRequest, ticket: Ticket, job: asyncio.Future, early: asyncio.Future, started: float,
    ) -> None:
        """The engine work of a request the client cancelled, for the requests that continue
        it: its answers go into the typeahead cache until a request it cannot serve
        supersedes it, or its deadline passes."""
        with self._engine_work_on():
            self.stats.unattended += 1
            left_s = request.deadline_ms / 1000 + ENGINE_GRACE_S - (time.perf_counter() - started)
            superseded = asyncio.ensure_future(ticket.superseded.wait())
            done: set[asyncio.Future] = set()
            try:
                done, _ = await asyncio.wait({job, early, superseded}, timeout=max(0.0, left_s), return_when=asyncio.FIRST_COMPLETED)
            finally:
                superseded.cancel()
                if not done & {job, early} and not job.done():
                    job.cancel()
            if superseded in done and not done & {job, early}:
                self.stats.superseded += 1
            elif job in done and not job.cancelled():
                self._answered(query, request, job, started, shown=False)
            elif early in done:
                await self._decode_on(query, request, ticket, job, started)

    @contextmanager
    def _engine_work_on(self) -> Iterator[None]:
        """Counts engine work that goes on after its request's answer or cancellation (`Stats.work_on`)."""
        self.stats.work_on += 1
        try:
            yield
        finally:
            self.stats.work_on -= 1

    def _begin(self, uri: str, query: Query) -> Ticket:
        previous = self._inflight.get(uri)
        if previous is not None:
            previous.supersede()
        for other, ticket in self._inflight.items():
            if other != uri and ticket.unattended is not None:
                ticket.supersede()  # the user moved on to another document: its cancelled request's decoding ends
        ticket = self._inflight[uri] = Ticket(query)
        return ticket

    def _end(self, uri: str, ticket: Ticket) -> None:
        ticket.finish()
        if self._inflight.get(uri) is ticket:
            del self._inflight[uri]


def _retrieved(job: asyncio.Future) -> None:
    """Marks an engine job's error as seen: one that ended in an error after its request
    stopped waiting (superseded, or the engine closed at shutdown) would otherwise be logged
    as "Task exception was never retrieved"."""
    if not job.cancelled():
        job.exception()


def _timed_out(job: asyncio.Future, started: float, deadline_ms: float) -> bool:
    """The engine's empty answer came at its deadline (or it said it was too late)."""
    if job.cancelled():
        return False
    if isinstance(job.exception(), DeadlineExceeded):
        return True
    return (time.perf_counter() - started) * 1000 >= deadline_ms


def _as_function(method: Callable) -> Callable:
    """pygls tags handlers with attributes, which bound methods cannot carry."""
    if asyncio.iscoroutinefunction(method):

        async def handler_async(params: Any) -> Any:
            return await method(params)

        return handler_async

    def handler(params: Any) -> Any:
        return method(params)

    return handler


def _uri_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


class KspecServer(LanguageServer):
    def __init__(self, options: ServerOptions | None = None):
        super().__init__(
            "kspec", VERSION, protocol_cls=KspecProtocol, converter_factory=strict_converter, text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental
        )
        self.session = Session(self, options or ServerOptions())
        self.exit_code = 0
        self.session.register()

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:  # type: ignore[override]
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        self._run(read_frames(ChunkReader.from_stream(stdin or sys.stdin.buffer), self.session.options.max_message_bytes))

    def start_tcp(self, host: str, port: int, token: str, limits: Limits = Limits()) -> None:
        """One client over TCP (debugging): the first connection that shows `token`
        (tcp_admission); prints the bound address on stderr."""
        with socket.create_server((host, port), backlog=limits.max_pending) as listener:
            bound = listener.getsockname()
            print(f"kspec lsp: listening on {bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
            admission = admit(listener, token, replace(limits, max_bytes=self.session.options.max_message_bytes))
        with admission.connection, admission.connection.makefile("wb") as writer:
            self.protocol.set_writer(StdoutWriter(writer))
            self._run(admission.frames)

    def _run(self, frames: Iterator[Frame]) -> None:
        try:
            asyncio.run(self._serve(frames))
        except SystemExit as exc:  # the `exit` notification: 0 after `shutdown`, else 1
            self.exit_code = exc.code if isinstance(exc.code, int) else 1
        except (KeyboardInterrupt, BrokenPipeError):
            self.exit_code = 1
        finally:
            self.session.close()
            self.session.join(EXIT_JOIN_S)

    async def _serve(self, frames: Iterator[Frame]) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        limit = self.session.options.max_message_bytes
        frames_to_loop(frames, asyncio.get_running_loop(), queue)
        report = lambda message: self.session.show(message, lsp.MessageType.Error)  # noqa: E731
        dispatcher = Dispatcher(self.protocol, self.session.normalize, report, limit)
        while (frame := await queue.get()) is not None:
            dispatcher.dispatch(frame)
        log.info("the client closed the connection")
