"""The kspec language server (pygls 2): inline completions from a warm engine.

One `Session` per client connection: the LSP lifecycle, the documents (incremental sync), the
settings, where the engine runs (current_engine.py: the one the settings call for), and what
the client is told; each LSP feature is one method.
A completion request becomes a `Query` here (the cursor's context within its budgets) and goes
through completion_flow.py (typeahead, supersession, debounce, the engine raced against the
deadline); items.py turns its texts into LSP items. pygls' private members are used only in
pygls_adapter.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Iterator
from dataclasses import asdict, replace
from functools import partial
from typing import Any, BinaryIO, Callable

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from kspec.engine.errors import InputError
from kspec.engine.serve.status import ERROR, READY, Status
from kspec.engine.version import version
from kspec.lsp_server.accept_stats import ACCEPT_COMMAND, Acceptance
from kspec.lsp_server.client_kind import handles_updates
from kspec.lsp_server.completion_flow import CompletionFlow, Query
from kspec.lsp_server.cursor_window import Budgets, editor_context, looks_binary
from kspec.lsp_server.documents import ENCODINGS, MAX_DOCUMENT_CHARS, UTF16, Document, DocumentStore, line_body
from kspec.lsp_server.current_engine import CurrentEngine
from kspec.lsp_server.engine_client import EngineClient
from kspec.lsp_server.crossfile.gatherer import SessionContext
from kspec.lsp_server.items import completion_items, inline_items, renders_markdown
from kspec.lsp_server.jsonrpc import ChunkReader, Dispatcher, Frame, read_frames, strict_converter
from kspec.lsp_server.options import Redactor, ServerOptions
from kspec.lsp_server.selected_item import SelectedItem, selected_item
from kspec.lsp_server.progress import LoadingProgress, client_shows_progress
from kspec.lsp_server.pygls_adapter import KspecProtocol, as_handler, running_handlers
from kspec.lsp_server.messages import Messages
from kspec.lsp_server.settings import Settings, parse_settings, pull_configuration
from kspec.lsp_server.status_report import STATUS_METHOD, StatusReport
from kspec.lsp_server.tcp_admission import Limits, admit
from kspec.lsp_server.typeahead import TypeaheadCache

__all__ = ["KspecServer", "Redactor", "ServerOptions", "Session", "negotiate_encoding"]

log = logging.getLogger("kspec.lsp")

VERSION = version()  # pyproject.toml, through the installed distribution
STATS_METHOD = "kspec/stats"
EXIT_JOIN_S = 3.0  # at exit, for the engine thread to leave torch code


def negotiate_encoding(capabilities: lsp.ClientCapabilities) -> str:
    """The client's first offered encoding we support (as pygls advertises it); else UTF-16."""
    offered = capabilities.general.position_encodings if capabilities.general else None
    for encoding in offered or ():
        value = getattr(encoding, "value", encoding)
        if value in ENCODINGS:
            return value
    return UTF16


class Session:
    def __init__(self, server: "KspecServer", options: ServerOptions):
        self.server = server
        self.options = options
        self.documents = DocumentStore()
        self.settings = Settings() if options.engine is None else Settings(engine=options.engine)
        self.typeahead = TypeaheadCache()
        self.acceptance = Acceptance()  # shown / accepted / partially accepted, by rank and language
        self.loading: LoadingProgress | None = None  # $/progress while the model loads (set at initialize)
        self.encoding = UTF16
        self.engines = CurrentEngine(options, self._on_status)
        self._pending_problems: list[str] = []
        self.messages = Messages(lambda params: self.server.window_show_message(params))
        self._user_set: set[str] = set()  # settings the client gave; the engine's machine defaults fill the rest
        self.report = StatusReport(partial(self.server.protocol.notify, STATUS_METHOD), self._status_extras)
        notify = lambda method, params: self.server.protocol.notify(method, params)  # noqa: E731
        self.extra = SessionContext()  # other files' context (workspace folders, recent places)
        self.flow = CompletionFlow(self.typeahead, self.report, self._current_engine, notify, lambda: self._user_set)

    def register(self) -> None:
        def feature(name: str, options: Any = None) -> Callable[[Callable], None]:
            return lambda method: self.server.feature(name, options)(as_handler(method))

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
        self.extra.set_folders(params)
        self.flow.handles_updates = handles_updates(params.capabilities.experimental)
        self.loading = LoadingProgress(self.server.work_done_progress, client_shows_progress(params.capabilities))
        parsed = parse_settings(params.initialization_options, self.settings)
        self._user_set = (self._user_set - parsed.cleared) | parsed.given
        self._set_settings(parsed.settings)
        self._pending_problems = parsed.problems
        log.info("initialized: position encoding %s, engine %s", self.encoding, self.settings.engine)

    def initialized(self, params: lsp.InitializedParams) -> None:
        for problem in self._pending_problems:
            self.messages.show(f"kspec: {problem}", lsp.MessageType.Warning)
        self._pending_problems = []
        self._ensure_engine()

    def shutdown(self, params: None) -> None:
        self.close()

    exit = shutdown  # both close the engine; pygls itself ends the process at `exit`

    def close(self) -> None:
        if self.report.closed:
            return
        self.report.closed = True
        self.flow.inflight.supersede()
        self.engines.close()

    def join(self, timeout_s: float) -> None:
        for engine in self.engines.engines():
            if not engine.join(timeout_s):
                log.warning("the engine did not stop within %.1f s", timeout_s)

    # --- documents ---------------------------------------------------------------------

    def did_open(self, params: lsp.DidOpenTextDocumentParams) -> None:
        item = params.text_document
        document = self.documents.open(item.uri, item.language_id, item.version, item.text, getattr(self.engines.engine, "log_file", None))
        self.typeahead.forget(item.uri)
        if document is not None and document.too_large:
            self._too_large(document)

    def did_change(self, params: lsp.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        try:
            document = self.documents.get(uri)
        except InputError:
            log.warning("didChange for a document that is not open (ignored)")
            return
        if document is None:  # one of kspec's own logs
            return
        for change in params.content_changes:
            whole = not isinstance(change, lsp.TextDocumentContentChangePartial)
            document.change(None if whole else (change.range.start, change.range.end), change.text, self.encoding)
            self.extra.note(uri, 0 if whole else change.range.start.line)
            if document.too_large:
                self._too_large(document)
        document.version = params.text_document.version

    def did_close(self, params: lsp.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        self.documents.close(uri)
        self.typeahead.forget(uri)
        self.extra.forget(uri)
        self.flow.inflight.supersede(uri)

    def _too_large(self, document: Document) -> None:
        self.messages.show(f"kspec: {document.uri} is too large for completions (over {MAX_DOCUMENT_CHARS} characters)", lsp.MessageType.Warning)

    # --- settings and the engine ---------------------------------------------------------

    async def did_change_configuration(self, params: lsp.DidChangeConfigurationParams) -> None:
        raw = params.settings
        workspace = self.server.client_capabilities.workspace
        if not raw and workspace and workspace.configuration:  # the client wants to be asked
            raw = await pull_configuration(self.server.workspace_configuration_async)
        parsed = parse_settings(raw, self.settings)
        self._user_set = (self._user_set - parsed.cleared) | parsed.given
        for problem in parsed.problems:
            self.messages.show(f"kspec: {problem}", lsp.MessageType.Warning)
        self._set_settings(parsed.settings)
        self._ensure_engine()

    def _set_settings(self, settings: Settings) -> None:
        if self.options.engine is not None and settings.engine != self.options.engine:
            settings = replace(settings, engine=self.options.engine)
        if settings != self.settings:
            self.typeahead.clear()  # suggestions made under other settings (k, max tokens, mode, model)
        self.settings = settings
        self.options.redactor.debug = settings.debug_log

    def _ensure_engine(self) -> None:
        """The engine the settings call for, made and started unless it runs already."""
        if self.report.closed or self.engines.fits(self.settings):
            return
        if self.engines.retire():
            self.typeahead.clear()  # another model's suggestions
        self.messages.forget()
        engine = self.engines.make(self.settings, lambda message: self.messages.show(message, lsp.MessageType.Info))
        self.report.status = engine.status  # the replaced engine's (its model, "ready") must not be told again
        asyncio.ensure_future(engine.start())

    def _current_engine(self) -> EngineClient | None:
        if self.engines.engine is None:
            self._ensure_engine()
        return self.engines.engine

    # --- status and messages ---------------------------------------------------------

    def _on_status(self, status: Status) -> None:
        self.report.status = status
        if self.loading is not None and not self.report.closed:
            self.loading.update(status)
        if status.state == READY:
            self.messages.forget()
        elif status.state == ERROR:
            self.messages.show(f"kspec: {status.message}", lsp.MessageType.Error)
        self.report.engine_status(status)

    def _status_extras(self) -> dict[str, Any]:
        """What $/kspec/status adds to the engine's status: acceptance totals, the last answer's
        context and prompt, the daemon's log file."""
        extras: dict[str, Any] = {
            "acceptance": self.acceptance.summary(), "context": {**self.extra.last, "tokens": self.report.context_tokens},
            "prompt": dict(self.report.prompt),
        }  # fmt: skip
        log_file = getattr(self.engines.engine, "log_file", None)
        if log_file is not None:
            extras["logFile"] = str(log_file)
        return extras

    def stats_request(self, params: Any) -> dict[str, Any]:
        return {
            **asdict(self.flow.stats),
            "documents": len(self.documents),
            "typeahead_entries": len(self.typeahead),
            "inflight": len(self.flow.inflight),
            "handlers": running_handlers(self.server.protocol),
            "engine_threads": self.engines.running_threads(),
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
            self.report.tell()

    # --- completions -------------------------------------------------------------------

    async def inline_completion(self, params: lsp.InlineCompletionParams) -> lsp.InlineCompletionList:
        """With the suggest widget open, the alternatives continue its selected item (selected_item.py)."""
        automatic = params.context.trigger_kind == lsp.InlineCompletionTriggerKind.Automatic
        uri, selected, chosen = params.text_document.uri, params.context.selected_completion_info, None
        if selected is not None and (document := self.documents.find(uri)) is not None:
            chosen = selected_item(document, params.position, selected.range, selected.text, self.encoding)
            if chosen is None:  # not at the cursor: nothing can agree with the widget
                return lsp.InlineCompletionList(items=[])
        query = self._query(uri, params.position, chosen)
        if query is None:
            return lsp.InlineCompletionList(items=[])
        alternatives = await self.flow.suggest(query, debounce=automatic)
        items = inline_items(query, alternatives, self.encoding) if chosen is None else chosen.items(query, alternatives, self.encoding)
        if items:
            self.acceptance.shown(query.document.language_id, len(items))
        return lsp.InlineCompletionList(items=items)

    async def completion(self, params: lsp.CompletionParams) -> lsp.CompletionList:
        query = self._query(params.text_document.uri, params.position)
        if query is None:
            return lsp.CompletionList(is_incomplete=True, items=[])
        alternatives = await self.flow.suggest(query, debounce=True)
        items = completion_items(query, alternatives, self.encoding, renders_markdown(self.server.client_capabilities))
        if items:
            self.acceptance.shown(query.document.language_id, len(items))
        return lsp.CompletionList(is_incomplete=True, items=items)

    def _query(self, uri: str, position: lsp.Position, chosen: SelectedItem | None = None) -> Query | None:
        """The request's context (with the suggest widget's item inserted: `chosen`), None when this
        document gets no completions, InvalidParams for bad input."""
        self.flow.stats.requests += 1
        try:
            document = self.documents.get(uri) if chosen is None else chosen.document
            if document is None or document.too_large:  # one of kspec's own logs, or too large
                return None
            cursor = document.cursor(position.line, position.character, self.encoding) if chosen is None else chosen.cursor
        except InputError as exc:
            self.flow.stats.errors += 1
            raise JsonRpcInvalidParams(str(exc)) from None
        settings = self.settings
        if not settings.language_enabled(document.language_id):
            return None
        context = editor_context(document, cursor, Budgets(settings.prefix_chars, settings.suffix_chars))
        if looks_binary(context):
            self.messages.show(f"kspec: {uri} looks binary (NUL characters); no completions there", lsp.MessageType.Info)
            return None
        fitted = (self.report.status.defaults or {}).get("prompt_tokens")
        extra = self.extra.gather(self.documents, document, cursor.line, settings.context_files, settings.context_tokens, fitted)
        self.report.context_tokens = 0  # until the engine's answer says how many of them went in
        body = line_body(document.lines[cursor.line])
        return Query(document, cursor, body, context, settings, document.version, extra.pieces, extra.members)


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
        report = lambda message: self.session.messages.show(message, lsp.MessageType.Error)  # noqa: E731
        await Dispatcher(self.protocol, report, self.session.options.max_message_bytes).serve(frames)
        log.info("the client closed the connection")
