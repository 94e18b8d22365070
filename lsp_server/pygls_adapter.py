"""Everything kspec needs from pygls beyond its public API, in one place.

pygls 2.1 (pinned in constraints.txt) has no public hook for what kspec changes in its protocol,
so `KspecProtocol` overrides three private methods and reads its private table of request
futures, and the JSON-RPC dispatcher sends a raw error through its private `_send_data`.
tests/unit/lsp/test_pygls_adapter.py checks that each private member still exists with the
signature used here: a pygls upgrade that changes one fails there, not in a user's editor.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

log = logging.getLogger("kspec.lsp")

# The private members of pygls' LanguageServerProtocol used here, with their parameters
PYGLS_PRIVATE_METHODS = {
    "_execute_handler": ("self", "msg_id", "handler", "callback", "args", "kwargs"),
    "_handle_response": ("self", "msg_id", "result", "error"),
    "_send_handler_result": ("self", "future", "msg_id"),
    "_send_response": ("self", "msg_id", "result", "error"),
    "_send_data": ("self", "data"),
}
PYGLS_PRIVATE_ATTRIBUTES = ("_request_futures",)


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


def running_handlers(protocol: LanguageServerProtocol) -> int:
    """Handlers pygls is running now (its book of request futures)."""
    return len(protocol._request_futures)


def send_raw(protocol: LanguageServerProtocol, data: dict[str, Any]) -> None:
    """One JSON-RPC message as given (a plain dict: pygls' typed response drops `"id": null`)."""
    protocol._send_data(data)


def as_handler(method: Callable) -> Callable:
    """pygls tags handlers with attributes, which bound methods cannot carry."""
    if asyncio.iscoroutinefunction(method):

        async def handler_async(params: Any) -> Any:
            return await method(params)

        return handler_async

    def handler(params: Any) -> Any:
        return method(params)

    return handler
