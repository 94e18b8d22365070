"""Answers shaped for a typist: an early answer with what is complete, decoding going on
into the typeahead cache, the client told, and a diverging edit cancelling it; a request
cancelled at the next keystroke whose engine work goes on for the request that continues it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcRequestCancelled

from lsp_harness import FAST, Editor, editor_session

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

PINNED_PROMPT_TOKENS = 700
CODE = "def total(values):\n    result = 0\n    for value in values:\n        "


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(model_dir: Path) -> Any:
    # answer early (1 ms: at the end of the prefill), then decode on to 48 tokens; the prompt
    # budget pinned (these prompts are far shorter)
    options = {"model": str(model_dir), **FAST, "maxTokens": 48, "firstAnswerMs": 1, "promptTokens": PINNED_PROMPT_TOKENS}
    async with editor_session(options) as session:
        await session.ready()
        yield session


async def test_status_shows_what_the_engine_chose_for_this_machine(editor: Editor) -> None:
    ready = await editor.ready()
    defaults = ready["defaults"]
    assert {"k", "maxTokens", "firstAnswerMs", "roundMs", "prefillMsPerToken"} <= set(defaults)
    assert 1 <= defaults["k"] <= 4 and defaults["roundMs"] > 0
    assert defaults["promptTokens"] == PINNED_PROMPT_TOKENS  # the setting, not the fit's choice
    assert ready["kernels"].startswith("float32"), ready  # how it computes here (and, on the fast path, the measured choice)


async def test_early_answer_then_longer_alternatives_from_the_typeahead_cache(editor: Editor) -> None:
    uri = "file:///early/continue.py"
    editor.open(uri, CODE)
    first = await editor.inline(uri, 3, 8)
    assert first, "an early answer with what was complete"
    update = await editor.wait_update(uri)
    assert update == {"uri": uri, "version": 1, "final": update["final"]}  # the harness opens documents at version 1
    assert isinstance(update["final"], bool)  # grown interim alternatives, or the final ones
    before = await editor.stats()
    again = await editor.inline(uri, 3, 8)
    after = await editor.stats()
    assert after["typeahead_hits"] == before["typeahead_hits"] + 1 and after["engine_calls"] == before["engine_calls"]
    assert max(len(item.insert_text) for item in again) > max(len(item.insert_text) for item in first)
    assert after["early_answers"] >= 1 and after["continued"] + after["interim_updates"] >= 1  # told of grown or final ones


async def test_a_diverging_request_cancels_the_decoding_that_went_on(editor: Editor) -> None:
    uri = "file:///early/diverge.py"
    editor.configure({**FAST, "maxTokens": 512, "firstAnswerMs": 1})  # decoding goes on far longer than this test
    try:
        editor.open(uri, CODE)
        before = await editor.settled()
        assert await editor.inline(uri, 3, 8)
        editor.edit(uri, (0, 0), (0, 0), "import os\n")  # not typing into the suggestion: a new request
        await editor.inline(uri, 4, 8)
        stats = await editor.stats()
        editor.close(uri)  # its decoding stops: the next tests' requests decode alone
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})
    assert stats["superseded"] == before["superseded"] + 1
    assert all(update["uri"] != uri or update["version"] != 1 for update in editor.updates)  # the first went unannounced


def _after(line: int, character: int, typed: str) -> tuple[int, int]:
    """The cursor after typing `typed` at (line, character)."""
    if "\n" in typed:
        return line + typed.count("\n"), len(typed.rsplit("\n", 1)[1].encode("utf-16-le")) // 2
    return line, character + len(typed.encode("utf-16-le")) // 2


async def _cancelled_once_decoding(editor: Editor, uri: str, msg_id: int) -> None:
    """Ask at the end of CODE, and cancel the request once the engine works on it (an editor
    cancels the pending request at the next keystroke); return once its first interim
    answer is in the typeahead cache (no other document may be decoding)."""
    before = await editor.stats()
    send = editor.client.protocol.send_request_async
    request = asyncio.ensure_future(send(lsp.TEXT_DOCUMENT_INLINE_COMPLETION, editor.inline_params(uri, 3, 8, automatic=True), msg_id=msg_id))
    deadline = asyncio.get_running_loop().time() + 30
    while (await editor.stats())["engine_calls"] == before["engine_calls"]:
        assert asyncio.get_running_loop().time() < deadline, "the request never reached the engine"
    editor.client.cancel_request(lsp.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(request, 10)
    while (await editor.stats())["typeahead_entries"] == before["typeahead_entries"]:
        assert asyncio.get_running_loop().time() < deadline, "no interim answer from the cancelled request"


# interim answers from 300 ms on, decoding far longer than a test; no other files' context: the
# documents here share one text, and each other's context would make their prompts differ
LONG = {**FAST, "maxTokens": 512, "firstAnswerMs": 300, "contextFiles": False}


async def test_typing_on_is_served_by_the_cancelled_request_that_went_on(editor: Editor) -> None:
    """The request of keystroke N is cancelled when keystroke N+1 is typed. Its engine work
    goes on; typing what one of its branches writes is answered from them, without a new
    engine call: at once from the interim answers, or, typed ahead of them, at the round
    that writes that far."""
    reference = "file:///early/join-reference.py"
    editor.open(reference, CODE)
    editor.configure({**LONG, "firstAnswerMs": 0})
    try:
        written = max((item.insert_text for item in await editor.inline(reference, 3, 8)), key=len)  # a whole branch
        # (here ~3.5k characters in ~5 s: three quarters of it is far ahead of the first interim answers)
        ahead = written[: len(written) * 3 // 4]
        for uri, typed in (("file:///early/join-hit.py", written[:1]), ("file:///early/join-ahead.py", ahead)):
            editor.configure(LONG)
            editor.open(uri, CODE)
            # Nothing else decoding: batched with other rows, the random model's greedy branch could differ from `written`.
            before = await editor.settled()
            await _cancelled_once_decoding(editor, uri, 5151 + len(typed))
            editor.edit(uri, (3, 8), (3, 8), typed)
            items = await editor.inline(uri, *_after(3, 8, typed))
            after = await editor.stats()
            assert any(written.startswith(typed + item.insert_text) for item in items), (typed, items)
            assert after["engine_calls"] == before["engine_calls"] + 1  # the cancelled request's only
            assert after["unattended"] == before["unattended"] + 1
            assert after["typeahead_hits"] == before["typeahead_hits"] + 1
            if len(typed) > 1:
                assert after["joined"] == before["joined"] + 1  # waited for the rounds that wrote that far
            editor.close(uri)  # its decoding stops: the next case's interim answers are its own
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})


async def test_typing_off_the_branches_starts_over(editor: Editor) -> None:
    """A keystroke that none of the branches decoding on wrote supersedes them at once."""
    uri = "file:///early/join-miss.py"
    editor.configure(LONG)
    try:
        editor.open(uri, CODE)
        before = await editor.settled()
        await _cancelled_once_decoding(editor, uri, 5252)
        editor.edit(uri, (3, 8), (3, 8), "\u00a7")  # § : no branch of the random model starts with it
        items = await editor.inline(uri, 3, 9)
        after = await editor.stats()
        editor.close(uri)
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})
    assert items
    assert after["engine_calls"] == before["engine_calls"] + 2 and after["joined"] == before["joined"]
    assert after["superseded"] >= before["superseded"] + 1


async def test_a_request_in_another_document_ends_a_cancelled_requests_decoding(editor: Editor) -> None:
    """The user moved on: what a cancelled request still decodes for its document stops."""
    left, right = "file:///early/left.py", "file:///early/right.py"
    editor.configure(LONG)
    try:
        editor.open(left, CODE)
        editor.open(right, CODE)
        before = await editor.settled()  # the previous test's closed document counted
        await _cancelled_once_decoding(editor, left, 5353)
        assert await editor.inline(right, 3, 8)
        after = await editor.stats()
        editor.close(left)
        editor.close(right)
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})
    assert after["superseded"] == before["superseded"] + 1  # the left document's decoding, not the right one's


async def test_the_suggestion_grows_while_the_user_pauses(editor: Editor) -> None:
    """After the early answer, the client is told of grown alternatives while decoding goes
    on, not only at the final answer: asking again shows the longer ones at once."""
    uri = "file:///early/grows.py"
    editor.configure({**FAST, "maxTokens": 512, "firstAnswerMs": 1})  # decoding goes on for seconds
    try:
        editor.open(uri, CODE)
        before = await editor.stats()
        first = await editor.inline(uri, 3, 8)
        update = await editor.wait_update(uri)
        told = await editor.stats()
        again = await editor.inline(uri, 3, 8)
        editor.close(uri)
    finally:
        editor.configure({**FAST, "maxTokens": 48, "firstAnswerMs": 1})
    assert update == {"uri": uri, "version": 1, "final": False}  # grown while decoding goes on
    assert told["interim_updates"] > before["interim_updates"] and told["continued"] == before["continued"]  # before the final answer
    assert max(len(item.insert_text) for item in again) > max(len(item.insert_text) for item in first)
