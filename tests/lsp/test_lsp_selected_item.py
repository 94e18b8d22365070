"""The real `kspec lsp` with VS Code's inline completion context: with the suggest widget open
(`selectedCompletionInfo`, LSP 3.18) every alternative starts with the selected item's text over
its range, then the model's continuation (the engine asked as if the item were inserted); and
kspec's own log files, opened in the editor ("kspec: Show log"), are never completion context.
The engine is a scripted OpenAI-compatible server (the model's text for the end of the prompt)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lsprotocol import types as lsp

from lsp_harness import Editor, editor_session
from test_lsp_editor_states import ScriptedEngine

pytestmark = [pytest.mark.asyncio]

# the more specific ends first: the scripted engine answers for the first end the prompt holds
SCRIPT = {
    "dy = point.x": [" - origin.x", " * 2"],
    "dy = point.y": ["ms", " - origin.y"],  # healed: the model's branches go on from `y` into other names
    "dy = point.": ["y - origin.y", "x"],
    "total = sum(values": ["[1:])\n"],
    "total = sum(val": ["ues)\n"],
    "count = len(self.item": ["s)\n", "_count)\n"],
}
SETTINGS = {"k": 2, "debounceMs": 0, "deadlineMs": 30000, "contextFiles": False}


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    engine = ScriptedEngine(SCRIPT)
    yield engine
    engine.close()


def with_selected(editor: Editor, uri: str, line: int, character: int, selected: lsp.Range, text: str) -> lsp.InlineCompletionParams:
    params = editor.inline_params(uri, line, character)
    params.context.selected_completion_info = lsp.SelectedCompletionInfo(range=selected, text=text)
    return params


async def ask(editor: Editor, params: lsp.InlineCompletionParams) -> list[lsp.InlineCompletionItem]:
    result = await editor.client.text_document_inline_completion_async(params)
    assert isinstance(result, lsp.InlineCompletionList)
    return list(result.items)


async def test_alternatives_continue_the_selected_item(scripted: ScriptedEngine) -> None:
    async with editor_session({"engine": "openai", "engineUrl": scripted.url, **SETTINGS}, args=()) as editor:
        await editor.ready()
        uri = "file:///work/geometry.py"
        editor.open(uri, "point = origin = Point()\ndy = point.\n")
        at = lsp.Position(1, 11)
        # without the widget: the model's own alternatives
        assert [item.insert_text for item in await editor.inline(uri, 1, 11)] == ["y - origin.y", "x"]
        # the widget selects `.x` (an empty range at the cursor): both start with it
        items = await ask(editor, with_selected(editor, uri, 1, 11, lsp.Range(at, at), "x"))
        assert [item.insert_text for item in items] == ["x - origin.x", "x * 2"]
        assert all(item.range == lsp.Range(at, at) for item in items)
        # `.y` selected: `yms` would write another name than the item's, so only `y - origin.y` shows
        items = await ask(editor, with_selected(editor, uri, 1, 11, lsp.Range(at, at), "y"))
        assert [item.insert_text for item in items] == ["y - origin.y"]


async def test_the_selected_item_replaces_the_word_typed(scripted: ScriptedEngine) -> None:
    async with editor_session({"engine": "openai", "engineUrl": scripted.url, **SETTINGS}, args=()) as editor:
        await editor.ready()
        uri = "file:///work/size.py"
        editor.open(uri, "values = [1]\ntotal = sum(val)\n")  # the editor closed the bracket
        # `val|)`: the widget's `values` replaces `val` (range 12..15)
        selected = lsp.Range(lsp.Position(1, 12), lsp.Position(1, 15))
        items = await ask(editor, with_selected(editor, uri, 1, 15, selected, "values"))
        # the `)` the model wrote again is trimmed (the suffix holds it): over the item's range only
        assert [item.insert_text for item in items] == ["values[1:]"]
        assert items[0].range == selected
        # a range elsewhere than at the cursor: nothing could agree with the widget
        elsewhere = lsp.Range(lsp.Position(0, 0), lsp.Position(0, 6))
        assert await ask(editor, with_selected(editor, uri, 1, 15, elsewhere, "values")) == []
        # VS Code's word `item` replaces `it` (range 17..19): the model writes `items`, a name the file
        # holds, so it shows; `item_count` is written nowhere in the file, so it does not
        stock = "file:///work/stock.py"
        editor.open(stock, "self.items = []\ncount = len(self.it)\n")
        selected = lsp.Range(lsp.Position(1, 17), lsp.Position(1, 19))
        items = await ask(editor, with_selected(editor, stock, 1, 19, selected, "item"))
        assert [item.insert_text for item in items] == ["items"]
        assert items[0].range == selected


async def test_kspecs_own_log_is_never_a_document(scripted: ScriptedEngine) -> None:
    folder = Path(tempfile.gettempdir()) / f"kspec-{os.getuid()}"
    async with editor_session({"engine": "openai", "engineUrl": scripted.url, **SETTINGS}, args=()) as editor:
        await editor.ready()
        engine_log = (folder / "engine-v9-0123456789abcdef.log").as_uri()
        other_log = "file:///work/build.log"
        editor.open(engine_log, "size = len(val", language="plaintext")  # a runtime folder's .log file
        editor.open(other_log, "size = len(val", language="log")  # VS Code's language for log files
        editor.edit(engine_log, (0, 0), (0, 0), "x")  # changes to it are ignored quietly
        assert await editor.inline(engine_log, 0, 15) == []
        assert await editor.inline(other_log, 0, 14) == []
        stats = await editor.stats()
        assert stats["documents"] == 0 and stats["engine_calls"] == 0 and stats["errors"] == 0
        editor.close(engine_log)
        editor.open("file:///work/size.py", "size = len(val")  # an ordinary file still is one
        assert (await editor.stats())["documents"] == 1
