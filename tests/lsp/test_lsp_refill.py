"""The real `kspec lsp`: once the user typed into the alternatives shown, the typeahead cache may
hold fewer than k of them for the text as typed (`return wi|` leaves `width * height` of three).
Typing on is served from it; asked for by hand (Alt+] in VS Code asks with trigger kind Invoked)
the engine is asked for k at the text as typed, the one on screen first. The engine is a scripted
OpenAI-compatible server (the model's texts for the end of the prompt)."""

from __future__ import annotations

import pytest

from lsp_harness import editor_session
from test_lsp_editor_states import ScriptedEngine

pytestmark = [pytest.mark.asyncio]

SCRIPT = {
    "    return wi": ["dth + height", "dth * height", "dth"],  # the likeliest is another than the one shown
    "    return ": ["width * height", "0", "None"],
}
SETTINGS = {"k": 3, "debounceMs": 0, "deadlineMs": 30000, "contextFiles": False}


async def test_asked_for_by_hand_after_typing_into_them_k_alternatives_come_back() -> None:
    engine = ScriptedEngine(SCRIPT)
    try:
        async with editor_session({"engine": "openai", "engineUrl": engine.url, **SETTINGS}, args=()) as editor:
            await editor.ready()
            uri = "file:///work/area.py"
            editor.open(uri, "def area(width, height):\n    return \n")
            first = await editor.inline(uri, 1, 11, automatic=True)
            assert first[0].insert_text == "width * height" and len(first) == 3 and engine.posts == 1
            editor.edit(uri, (1, 11), (1, 11), "wi")  # typed into the first
            typed_on = await editor.inline(uri, 1, 13, automatic=True)
            assert [item.insert_text for item in typed_on] == ["dth * height"] and engine.posts == 1  # from the cache
            asked = await editor.inline(uri, 1, 13)  # Invoked: by hand
            texts = [item.insert_text for item in asked]
            assert texts[0] == "dth * height" and sorted(texts) == sorted(SCRIPT["    return wi"]) and engine.posts == 2
            again = await editor.inline(uri, 1, 13)  # the engine's answer for this text is in the cache now
            assert [item.insert_text for item in again] == texts and engine.posts == 2
            stats = await editor.stats()
            assert (stats["refilled"], stats["typeahead_hits"]) == (1, 2), stats
    finally:
        engine.close()


async def test_a_client_that_may_ask_invoked_at_every_keystroke_is_served_from_the_cache() -> None:
    """A client that did not declare $/kspec/suggestionsUpdated may send Invoked (or no context)
    for every keystroke: typed into, its alternatives come from the cache, as many as are left."""
    engine = ScriptedEngine(SCRIPT)
    try:
        async with editor_session({"engine": "openai", "engineUrl": engine.url, **SETTINGS}, args=(), updates=False) as editor:
            await editor.ready()
            uri = "file:///work/area.py"
            editor.open(uri, "def area(width, height):\n    return \n")
            assert len(await editor.inline(uri, 1, 11)) == 3 and engine.posts == 1
            editor.edit(uri, (1, 11), (1, 11), "wi")
            assert [item.insert_text for item in await editor.inline(uri, 1, 13)] == ["dth * height"] and engine.posts == 1
    finally:
        engine.close()


async def test_the_alternative_on_screen_stays_first_where_the_engine_no_longer_writes_it() -> None:
    """At the text as typed the model may not write the alternative on screen again (`return wi|`:
    `dth * height` is gone from its answer). It stays first all the same, then the engine's others
    up to k: the step the user asked for goes to another one, and back again finds it."""
    engine = ScriptedEngine({**SCRIPT, "    return wi": ["dth + height", "dth", "ndow"]})
    try:
        async with editor_session({"engine": "openai", "engineUrl": engine.url, **SETTINGS}, args=()) as editor:
            await editor.ready()
            uri = "file:///work/area.py"
            editor.open(uri, "def area(width, height):\n    return \n")
            assert (await editor.inline(uri, 1, 11, automatic=True))[0].insert_text == "width * height"
            editor.edit(uri, (1, 11), (1, 11), "wi")
            asked = await editor.inline(uri, 1, 13)
            assert [item.insert_text for item in asked] == ["dth * height", "dth + height", "dth"] and engine.posts == 2
    finally:
        engine.close()
