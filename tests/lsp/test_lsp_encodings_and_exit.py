"""Negotiated position encodings (UTF-8, UTF-32) and a client that vanishes mid-request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lsp_harness import FAST, editor_session
from lsprotocol import types as lsp

LINE = 's = "😀é'  # 😀: 4 UTF-8 bytes, 2 UTF-16 units, 1 code point; é: 2 bytes, 1 unit, 1 code point


@pytest.mark.parametrize(
    ("client", "encoding", "positions"),
    [
        # (requested character, where the server says the cursor is)
        ("neovim@v0.11.0", lsp.PositionEncodingKind.Utf8, [(11, 11), (7, 5), (10, 9)]),  # offers utf-8 first
        ("emacs", lsp.PositionEncodingKind.Utf32, [(7, 7), (6, 6), (5, 5)]),  # offers utf-32 first
    ],
)
async def test_negotiated_encoding_is_used_for_positions(model_dir: Path, client: str, encoding: str, positions: list[tuple[int, int]]) -> None:
    async with editor_session({"model": str(model_dir), **FAST}, client=client) as editor:
        assert editor.initialize_result.capabilities.position_encoding == encoding  # type: ignore[attr-defined]
        await editor.ready()
        uri = "file:///work/enc.py"
        editor.open(uri, LINE + '"\n')
        for requested, expected in positions:
            items = await editor.inline(uri, 0, requested)
            assert items
            assert all(item.range is not None and item.range.start == lsp.Position(0, expected) for item in items), (requested, items)


async def test_client_disconnecting_mid_request_ends_the_server(model_dir: Path) -> None:
    async with editor_session({"model": str(model_dir), **FAST, "maxTokens": 256}) as editor:
        await editor.ready()
        editor.open("file:///work/bye.py", "def bye():\n    ")
        request = asyncio.ensure_future(editor.inline("file:///work/bye.py", 1, 4))
        deadline = asyncio.get_running_loop().time() + 30
        while (await editor.stats())["engine_calls"] == 0:
            assert asyncio.get_running_loop().time() < deadline
        server = editor.client._server
        assert server is not None and server.stdin is not None
        server.stdin.close()  # the editor is gone, without shutdown/exit
        assert await asyncio.wait_for(server.wait(), 30) == 0
        request.cancel()
