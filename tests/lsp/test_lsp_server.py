"""`kspec lsp` end to end: one real server (in-process engine, small random model) for the module.

Each test uses its own document URIs; tests that change settings restore them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcMethodNotFound, JsonRpcRequestCancelled

from kspec.lsp_server.edits import replaced_chars
from lsp_harness import FAST, Editor, editor_session

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::pytest_lsp.checks.LspSpecificationWarning"),
]
MESSAGE_LIMIT = 48 * 1024 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(model_dir: Path) -> Any:
    options = {"model": str(model_dir), **FAST, "temperature": "hot", "colour": "blue"}
    async with editor_session(options, args=("--engine", "inprocess", "--max-message-bytes", str(MESSAGE_LIMIT))) as session:
        await session.ready()
        yield session


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def assert_ranges(items: list[lsp.InlineCompletionItem], line: int, character: int, line_suffix: str = "") -> None:
    assert items, "expected at least one suggestion"
    for item in items:
        assert isinstance(item.insert_text, str) and item.insert_text
        assert item.range is not None
        assert (item.range.start.line, item.range.start.character) == (line, character)
        replaced = utf16_len(line_suffix[: replaced_chars(item.insert_text, line_suffix)])
        assert (item.range.end.line, item.range.end.character) == (line, character + replaced)


async def test_capabilities(editor: Editor) -> None:
    capabilities = editor.initialize_result.capabilities  # type: ignore[attr-defined]
    assert capabilities.inline_completion_provider is not None
    assert capabilities.completion_provider is not None
    assert capabilities.position_encoding == lsp.PositionEncodingKind.Utf16  # VS Code offers nothing else
    sync = capabilities.text_document_sync
    assert sync.change == lsp.TextDocumentSyncKind.Incremental and sync.open_close


async def test_status_loading_then_ready(editor: Editor) -> None:
    states = [s["state"] for s in editor.statuses]
    assert states.index("loading") < states.index("ready")
    assert editor.statuses[states.index("loading")]["progress"] == 0.0
    assert editor.statuses[states.index("ready")]["progress"] == 1.0


async def test_invalid_initialization_options_are_named(editor: Editor) -> None:
    assert any("using the default" in m for m in await editor.wait_message("'temperature'"))
    assert await editor.wait_message("unknown setting 'colour'")


async def test_open_change_and_inline_completion(editor: Editor) -> None:
    uri = "file:///work/add.py"
    editor.open(uri, "def add(a, b):\n    return \n")
    items = await editor.inline(uri, 1, 11)
    assert 1 <= len(items) <= FAST["k"]
    assert_ranges(items, 1, 11)
    latest = editor.statuses[-1]
    assert latest["state"] == "ready" and latest["latencyMs"] > 0

    # An incremental change: a new line whose cursor sits inside auto-closed brackets.
    editor.edit(uri, (2, 0), (2, 0), "value = max()")
    items = await editor.inline(uri, 2, 12)
    assert_ranges(items, 2, 12, line_suffix=")")


async def test_typeahead_serves_the_rest_without_the_engine(editor: Editor) -> None:
    uri = "file:///work/typeahead.py"
    editor.open(uri, "names = \n")
    items = await editor.inline(uri, 0, 8)
    longest = max(items, key=lambda item: len(item.insert_text))
    text = longest.insert_text
    assert len(text) >= 2
    before = await editor.stats()

    typed = text[0]
    editor.edit(uri, (0, 8), (0, 8), typed)
    position = (1, 0) if typed == "\n" else (0, 8 + utf16_len(typed))
    items = await editor.inline(uri, *position, automatic=True)  # a keystroke: as editors ask
    after = await editor.stats()
    # the rest of the suggestion, or more of it: the engine keeps decoding the branches after an
    # answer into the typeahead cache, so by now the cache may hold a longer version
    assert any(item.insert_text.startswith(text[1:]) for item in items), (text, items)
    assert after["typeahead_hits"] == before["typeahead_hits"] + 1
    assert after["engine_calls"] == before["engine_calls"]


async def test_astral_characters_in_utf16(editor: Editor) -> None:
    uri = "file:///work/emoji.py"
    line = 'emoji = "😀😀'
    editor.open(uri, line + '"\n')
    end = utf16_len(line)  # 13: each emoji is two UTF-16 code units
    assert end == 13
    assert_ranges(await editor.inline(uri, 0, end), 0, end, line_suffix='"')
    # Inside the second emoji's surrogate pair: rounded down to the character boundary.
    assert_ranges(await editor.inline(uri, 0, end - 1), 0, end - 2, line_suffix='😀"')


async def test_newer_request_supersedes_and_cancel_request_is_honoured(editor: Editor) -> None:
    uri = "file:///work/cancel.py"
    editor.open(uri, "import os\n")
    editor.configure({**FAST, "debounceMs": 2000})
    try:
        before = await editor.stats()
        send = editor.client.protocol.send_request_async
        params = editor.inline_params(uri, 1, 0, automatic=True)
        first = asyncio.ensure_future(send(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=4241))
        second = asyncio.ensure_future(send(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=4242))  # sent after the first
        assert not (await asyncio.wait_for(first, 10)).items  # superseded while debouncing
        editor.client.cancel_request(lsp.CancelParams(id=4242))
        with pytest.raises(JsonRpcRequestCancelled):
            await asyncio.wait_for(second, 10)
        after = await editor.stats()
        assert after["superseded"] == before["superseded"] + 1
        assert after["cancelled"] == before["cancelled"] + 1
        assert after["engine_calls"] == before["engine_calls"]  # neither reached the engine
        assert after["inflight"] == 0
    finally:
        editor.configure(FAST)
    assert await editor.inline(uri, 1, 0)  # still answering


async def test_cancel_while_the_engine_runs(editor: Editor) -> None:
    uri = "file:///work/long.py"
    editor.open(uri, "def long():\n    ")
    editor.configure({**FAST, "maxTokens": 256})
    try:
        before = await editor.stats()
        request = asyncio.ensure_future(
            editor.client.protocol.send_request_async(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, editor.inline_params(uri, 1, 4), msg_id=4343)
        )
        deadline = asyncio.get_running_loop().time() + 30
        while (await editor.stats())["engine_calls"] == before["engine_calls"]:
            assert asyncio.get_running_loop().time() < deadline, "the request never reached the engine"
        editor.client.cancel_request(lsp.CancelParams(id=4343))
        with pytest.raises(JsonRpcRequestCancelled):
            await asyncio.wait_for(request, 10)
    finally:
        editor.configure(FAST)
    assert await editor.inline(uri, 1, 4)  # the engine is free again


async def test_completion_fallback(editor: Editor) -> None:
    uri = "file:///work/fallback.py"
    editor.open(uri, "total = sum()\n")
    params = lsp.CompletionParams(text_document=lsp.TextDocumentIdentifier(uri), position=lsp.Position(0, 12))
    result = await asyncio.wait_for(editor.client.text_document_completion_async(params), 60)
    assert isinstance(result, lsp.CompletionList) and result.is_incomplete
    assert 1 <= len(result.items) <= FAST["k"]
    for item in result.items:
        assert item.label and len(item.label) <= 42
        assert isinstance(item.text_edit, lsp.TextEdit) and item.text_edit.new_text
        edit_range = item.text_edit.range
        assert (edit_range.start.line, edit_range.start.character) == (0, 12)
        assert edit_range.end.character == 12 + replaced_chars(item.text_edit.new_text, ")")


async def test_settings_change_invalid_value_is_named_and_defaulted(editor: Editor) -> None:
    editor.configure({**FAST, "k": 0, "maxTokens": "many"})
    try:
        # the notification's handler runs as a task: its messages may come after a later reply
        assert await editor.wait_message("'k' must be an integer between 1 and 32 (got 0); using the default 3")
        assert await editor.wait_message("'maxTokens'")
    finally:
        editor.configure(FAST)


async def test_unknown_document_and_positions(editor: Editor) -> None:
    with pytest.raises(JsonRpcInvalidParams, match="not open"):
        await editor.inline("file:///nowhere.py", 0, 0)
    uri = "file:///work/positions.py"
    editor.open(uri, "x = 1\n")
    with pytest.raises(JsonRpcInvalidParams, match="outside the document"):
        await editor.inline(uri, 7, 0)
    assert_ranges(await editor.inline(uri, 0, 999), 0, 5)  # past the line's end: the end (LSP)
    bad = editor.inline_params(uri, 0, 0)
    body = {"jsonrpc": "2.0", "id": 9001, "method": lsp.TEXT_DOCUMENT_INLINE_COMPLETION, "params": json.loads(json.dumps(editor.client.protocol._converter.unstructure(bad)))}
    body["params"]["position"]["line"] = -1
    with pytest.raises(JsonRpcInvalidParams, match="Invalid params"):
        await editor.raw_request(body, 9001)


async def test_malformed_messages_get_errors_and_the_server_keeps_answering(editor: Editor) -> None:
    editor.send_raw(b"{not json")
    editor.send_raw(b"[1, 2, 3]")
    editor.send_raw(b'{"jsonrpc": "2.0", "method": 42}')
    editor.send_raw(b"Content-Length: zero\r\n\r\n")
    with pytest.raises(JsonRpcMethodNotFound):
        await editor.raw_request({"jsonrpc": "2.0", "id": 9100, "method": "kspec/nothing", "params": {}}, 9100)
    with pytest.raises(JsonRpcException):
        await editor.raw_request({"jsonrpc": "1.0", "id": 9101, "method": "kspec/stats"}, 9101)
    assert (await editor.stats())["requests"] >= 0


async def test_both_trigger_kind_numberings(editor: Editor) -> None:
    uri = "file:///work/trigger.py"
    editor.open(uri, "for i in range(3):\n    \n")
    base = editor.client.protocol._converter.unstructure(editor.inline_params(uri, 1, 4))
    for msg_id, kind in ((9200, 0), (9201, 1), (9202, 2), (9203, None)):
        params = json.loads(json.dumps(base))
        if kind is None:
            del params["context"]
        else:
            params["context"]["triggerKind"] = kind
        result = await editor.raw_request({"jsonrpc": "2.0", "id": msg_id, "method": lsp.TEXT_DOCUMENT_INLINE_COMPLETION, "params": params}, msg_id)
        assert result.items, f"no items for triggerKind {kind}"
    params = json.loads(json.dumps(base))
    params["context"]["triggerKind"] = 7
    with pytest.raises(JsonRpcInvalidParams):
        await editor.raw_request({"jsonrpc": "2.0", "id": 9204, "method": lsp.TEXT_DOCUMENT_INLINE_COMPLETION, "params": params}, 9204)


async def test_invalid_utf8_and_lone_surrogates(editor: Editor) -> None:
    uri = "file:///work/bytes.py"
    text_open = {"uri": uri, "languageId": "python", "version": 1, "text": "PLACEHOLDER"}
    body = json.dumps({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": text_open}}).encode()
    editor.send_raw(body.replace(b"PLACEHOLDER", b"name = '\xff\xfe' + \\ud800 + "))  # invalid UTF-8 and a lone surrogate
    # Each invalid byte and the surrogate became one U+FFFD: the line is 18 characters.
    assert_ranges(await editor.inline(uri, 0, 18), 0, 18)
    assert_ranges(await editor.inline(uri, 0, 30), 0, 18)


async def test_huge_binary_and_oversized_documents(editor: Editor) -> None:
    big = "def f(x):\n    return x\n" * (20 * 1024 * 1024 // 24)  # about 20 MB
    editor.open("file:///work/big.py", big + "y = ")
    lines = big.count("\n")
    assert_ranges(await editor.inline("file:///work/big.py", lines, 4), lines, 4)
    editor.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier("file:///work/big.py")))

    editor.open("file:///work/blob.bin", "PK\x03\x04" + "\x00" * 100 + "data")
    assert await editor.inline("file:///work/blob.bin", 0, 50) == []
    assert await editor.wait_message("looks binary")

    editor.open("file:///work/too-large.py", "x" * (33 * 1024 * 1024))  # over the 32 Mi-character limit
    assert await editor.inline("file:///work/too-large.py", 0, 0) == []
    assert await editor.wait_message("too large")
    editor.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier("file:///work/too-large.py")))


async def test_oversized_message_is_skipped_and_answered(editor: Editor) -> None:
    padding = "x" * (MESSAGE_LIMIT + 1)
    with pytest.raises(JsonRpcException, match="exceeds the limit"):
        await editor.raw_request({"jsonrpc": "2.0", "id": 9300, "method": "kspec/stats", "params": {"padding": padding}}, 9300)
    assert await editor.wait_message("ignored a message of")
    assert (await editor.stats())["requests"] >= 0  # framing is still in sync


async def test_closing_documents_releases_them(editor: Editor) -> None:
    uri = "file:///work/closed.py"
    editor.open(uri, "a = 1\n")
    await editor.inline(uri, 1, 0)
    before = await editor.stats()
    editor.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri)))
    after = await editor.stats()
    assert after["documents"] == before["documents"] - 1
    assert after["inflight"] == 0
    with pytest.raises(JsonRpcInvalidParams):
        await editor.inline(uri, 0, 0)
