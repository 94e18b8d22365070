"""A plain LSP client (no kspec extensions: it never re-asks on `$/kspec/suggestionsUpdated`)
gets whole answers: no early answer, no notification, and the typeahead cache serves it
the same final alternatives; a client that declares the notification gets early answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lsp_harness import FAST
from raw_rpc import RawServer

from kspec.lsp_server.client_kind import DECLARES_UPDATES

pytestmark = [pytest.mark.asyncio]

CODE = "def total(values):\n    result = 0\n    for value in values:\n        "
URI = "file:///plain/total.py"
DECLARES = {"experimental": DECLARES_UPDATES}


def _inline(kind: int) -> dict[str, Any]:
    return {"textDocument": {"uri": URI}, "position": {"line": 3, "character": 8}, "context": {"triggerKind": kind}}


async def _session(tmp_path: Path, model_dir: Path, capabilities: dict[str, Any] | None) -> RawServer:
    server = await RawServer.start(tmp_path / "stderr.log", "--engine", "inprocess")
    # an early answer (1 ms: at the end of the prefill) if the client may have one, decoding on to 32 tokens
    await server.initialize({"model": str(model_dir), **FAST, "maxTokens": 32, "firstAnswerMs": 1}, capabilities=capabilities)
    await server.wait_ready()
    server.notify("textDocument/didOpen", {"textDocument": {"uri": URI, "languageId": "python", "version": 1, "text": CODE}})
    return server


def _texts(answer: dict[str, Any]) -> list[str]:
    return [item["insertText"] for item in answer["result"]["items"]]


@pytest.mark.parametrize("kind", [1, 2], ids=["invoked", "automatic"])
async def test_a_plain_client_gets_the_final_answer_and_no_interim_one(tmp_path: Path, model_dir: Path, kind: int) -> None:
    server = await _session(tmp_path, model_dir, None)
    try:
        first = _texts(await server.request(1, "textDocument/inlineCompletion", _inline(kind)))
        stats = (await server.request(2, "kspec/stats"))["result"]
        assert first, "the final answer"
        assert stats["early_answers"] == 0 and stats["work_on"] == 0, stats  # nothing decodes on after the answer
        assert not [n for n in server.notifications if n["method"] == "$/kspec/suggestionsUpdated"]
        again = _texts(await server.request(3, "textDocument/inlineCompletion", _inline(kind)))
        after = (await server.request(4, "kspec/stats"))["result"]
        assert after["typeahead_hits"] == stats["typeahead_hits"] + 1  # the cache answers ...
        assert again == first  # ... with the whole answer, not an interim fragment
    finally:
        await server.close()


async def test_a_client_that_declares_the_update_gets_an_early_answer(tmp_path: Path, model_dir: Path) -> None:
    server = await _session(tmp_path, model_dir, DECLARES)
    try:
        assert _texts(await server.request(1, "textDocument/inlineCompletion", _inline(1)))
        stats = (await server.request(2, "kspec/stats"))["result"]
        assert stats["early_answers"] == 1, stats
    finally:
        await server.close()
