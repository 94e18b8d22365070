"""Answers shaped for a typist: an early answer with what is complete, decoding going on
into the typeahead cache, the client told, and a diverging edit cancelling it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from lsp_harness import FAST, Editor, editor_session

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

CODE = "def total(values):\n    result = 0\n    for value in values:\n        "


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(model_dir: Path) -> Any:
    # answer after the first round (1 ms), then decode on to 48 tokens
    options = {"model": str(model_dir), **FAST, "maxTokens": 48, "firstAnswerMs": 1}
    async with editor_session(options) as session:
        await session.ready()
        yield session


async def test_status_shows_what_the_engine_chose_for_this_machine(editor: Editor) -> None:
    ready = await editor.ready()
    defaults = ready["defaults"]
    assert {"k", "maxTokens", "firstAnswerMs", "roundMs", "prefillMsPerToken"} <= set(defaults)
    assert 1 <= defaults["k"] <= 4 and defaults["roundMs"] > 0


async def test_early_answer_then_longer_alternatives_from_the_typeahead_cache(editor: Editor) -> None:
    uri = "file:///early/continue.py"
    editor.open(uri, CODE)
    first = await editor.inline(uri, 3, 8)
    assert first, "an early answer with what was complete"
    update = await editor.wait_update(uri)
    assert update == {"uri": uri, "version": 1}  # the harness opens documents at version 1
    before = await editor.stats()
    again = await editor.inline(uri, 3, 8)
    after = await editor.stats()
    assert after["typeahead_hits"] == before["typeahead_hits"] + 1 and after["engine_calls"] == before["engine_calls"]
    assert max(len(item.insert_text) for item in again) > max(len(item.insert_text) for item in first)
    assert after["early_answers"] >= 1 and after["continued"] >= 1


async def test_a_diverging_request_cancels_the_decoding_that_went_on(editor: Editor) -> None:
    uri = "file:///early/diverge.py"
    editor.configure({**FAST, "maxTokens": 512, "firstAnswerMs": 1})  # decoding goes on far longer than this test
    try:
        editor.open(uri, CODE)
        before = await editor.stats()
        assert await editor.inline(uri, 3, 8)
        editor.edit(uri, (0, 0), (0, 0), "import os\n")  # not typing into the suggestion: a new request
        await editor.inline(uri, 4, 8)
        stats = await editor.stats()
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})
    assert stats["superseded"] == before["superseded"] + 1
    assert all(update["uri"] != uri or update["version"] != 1 for update in editor.updates)  # the first went unannounced
