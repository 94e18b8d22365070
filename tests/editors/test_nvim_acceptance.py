"""The Neovim plugin tells the server what the user took: a full accept (<Tab>) and a
partial one (a word) run the item's `kspec.accepted` command, counted in `kspec/stats`
by rank and language; the command carries lengths, never the text."""

from __future__ import annotations

from typing import Any

import pytest
from nvim_rpc import Nvim
from test_nvim import K, fresh_comment_line, started_nvim, wait_ghost

# the server's acceptance counters, as a Lua expression
STATS = "(function() local c = vim.lsp.get_clients({ name = 'kspec' })[1]; local r = c:request_sync('kspec/stats', vim.NIL, 5000); return r and r.result and r.result.acceptance end)()"


@pytest.fixture(scope="module")
def nvim(tmp_path_factory, nvim_bin, kspec_bin, random_llama_dir):
    settings = {"model": str(random_llama_dir), "k": K, "maxTokens": 8, "debounceMs": 0, "deadlineMs": 60000, "engine": "inprocess"}
    with started_nvim(tmp_path_factory.mktemp("nvim"), nvim_bin, kspec_bin, settings) as editor:
        editor.lua("require('kspec').set({ firstAnswerMs = 0 })")
        yield editor


def acceptance(nvim: Nvim) -> dict[str, Any]:
    return nvim.lua(f"return {STATS}")


def test_full_and_partial_accepts_are_counted(nvim: Nvim) -> None:
    fresh_comment_line(nvim)
    shown = wait_ghost(nvim)
    assert acceptance(nvim)["shown"] >= 1
    nvim.input("<M-Right>")  # one word of it
    nvim.wait_for("the partial accept counted", f"{STATS}.partial == 1", 20)
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<Tab>")
    nvim.wait_for("the accept counted", f"{STATS}.accepted == 1", 20)
    counted = acceptance(nvim)
    assert counted["by_rank"][0]["accepted"] == 1 and counted["by_language"]["python"]["partial"] == 1
    assert shown["count"] == K
