"""Issue 56 in Neovim (the plugin's own ghost text), against the real `kspec lsp` answering
early (at the end of the prefill) and decoding on:

1. growth reaches the screen: every `$/kspec/suggestionsUpdated` (interim, then final) makes
   the plugin ask again, and the ghost becomes the final answer without a keystroke, also
   after next / prev;
2. k means k: next / prev pressed while the server decodes join that decoding (the step is
   taken over the final alternatives, not the interim ones), and then every one of the final
   answer's distinct alternatives can be cycled to, none twice;
3. the status tells the truth: busy while the server decodes for any document, idle only when
   nothing does;
4. (VS Code's suggest widget) Neovim's popup menu puts the item it selects into the line, and
   the ghost, hidden while the menu is open, continues the item once it is taken
   (editors/nvim/doc: why no `selectedCompletionInfo` is sent).

The plugin's handlers are wrapped (inside Neovim) to record each notification as it arrives;
every wait polls with a deadline."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvim_rpc import Nvim
from test_nvim import GHOST, MARKS, TEXT, diagnose, marks, started_nvim

K = 3
UPDATED = "$/kspec/suggestionsUpdated"
STATUS = "$/kspec/status"

# Wraps the kspec client's two notification handlers: _G.kspec_log.updated gets
# { version, final, asked } per $/kspec/suggestionsUpdated (asked: what the plugin's handler
# returned), _G.kspec_log.status gets { state, decoding, activity, line } per $/kspec/status (line:
# the statusline the plugin shows once it handled it).
RECORD = """
local client = vim.lsp.get_clients({ name = 'kspec', bufnr = 0 })[1]
_G.kspec_log = { updated = {}, status = {} }
local updated, status = client.handlers[a_updated], client.handlers[a_status]
client.handlers[a_updated] = function(err, params, ctx)
  local asked = updated(err, params, ctx)
  table.insert(_G.kspec_log.updated, { version = params.version, final = params.final == true, asked = asked })
  return asked
end
client.handlers[a_status] = function(err, params, ctx)
  local r = status(err, params, ctx)
  table.insert(_G.kspec_log.status, { state = params.state, decoding = params.decoding or {}, activity = params.activity or 'idle', line = require('kspec').statusline() })
  return r
end
""".replace("a_updated", repr(UPDATED)).replace("a_status", repr(STATUS))

# The server's answer now at the cursor (its typeahead cache: the final alternatives once the
# decoding is over), as the plugin's texts: what follows the cursor.
ANSWER = """
local client = vim.lsp.get_clients({ name = 'kspec', bufnr = 0 })[1]
local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
params.context = { triggerKind = 1 }
local r = client:request_sync('textDocument/inlineCompletion', params, 10000, 0)
assert(r and r.result, vim.inspect(r))
local line, col = vim.api.nvim_get_current_line(), vim.api.nvim_win_get_cursor(0)[2]
local texts = {}
for _, item in ipairs(r.result.items or r.result) do
  local text = type(item.insertText) == 'table' and item.insertText.value or item.insertText
  local scol = item.range and item.range.start.character or col
  texts[#texts + 1] = text:sub(col - scol + 1)
end
return texts
"""

# the server's last status (as it sent it) lists this buffer's document as decoding
DECODING = "#_G.kspec_log.status > 0 and vim.tbl_contains(_G.kspec_log.status[#_G.kspec_log.status].decoding, vim.uri_from_bufnr(0))"
FINAL_SEEN = "#vim.tbl_filter(function(u) return u.final and u.version == a[1] end, _G.kspec_log.updated) > 0"


@pytest.fixture(scope="module")
def nvim(tmp_path_factory, nvim_bin: str, kspec_bin: Path, random_llama_dir: Path):
    # an early answer at the end of the prefill, then up to 96 tokens decoded on (long enough
    # a decoding to press next during it: the tiny model decodes them in a few hundred ms)
    settings = {"model": str(random_llama_dir), "k": K, "maxTokens": 96, "debounceMs": 0, "deadlineMs": 60000, "engine": "inprocess", "firstAnswerMs": 1}
    with started_nvim(tmp_path_factory.mktemp("nvim"), nvim_bin, kspec_bin, settings) as editor:
        editor.lua(RECORD)
        editor.lua(PRESS)
        yield editor


PRESS = f"""
function _G.press_while_decoding(version)
  local a = {{ version }}
  if _G.pressed == nil and {GHOST}.shown() ~= nil and {DECODING} and not ({FINAL_SEEN}) then
    require('kspec')._key('next')
    _G.pressed = {{ shown = {GHOST}.shown(), joining = {GHOST}._debug().joining == true }}
  end
  return _G.pressed or false  -- once (wait_for evaluates its condition again to return it)
end
"""


def new_comment(nvim: Nvim, words: str) -> int:
    """A fresh buffer text and a comment line typed at its top (its own words: the server's
    typeahead cache has no answer for it, the engine is asked); the document version typed at."""
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    nvim.request("nvim_buf_set_lines", 0, 0, -1, False, TEXT.split("\n")[:-1])
    nvim.request("nvim_win_set_cursor", 0, [1, 0])
    nvim.lua("_G.kspec_log.updated = {}; _G.kspec_log.status = {}; _G.pressed = nil")
    nvim.input("i" + words)
    nvim.wait_for("the comment typed", "vim.api.nvim_get_current_line() == a[1] and vim.api.nvim_get_mode().mode == 'i'", 10, words)
    return nvim.lua("return vim.lsp.util.buf_versions[vim.api.nvim_get_current_buf()]")


def wait_settled(nvim: Nvim, version: int, what: str) -> dict:
    """The final notification for `version` came and the answer the plugin asked for is shown."""
    nvim.wait_for(
        what, f"({FINAL_SEEN}) and not {GHOST}._debug().pending and not {GHOST}._debug().joining and {GHOST}.shown() ~= nil",
        120, version, diagnose=lambda: diagnose(nvim) + f"\nrecorded: {nvim.lua('return _G.kspec_log')}",
    )  # fmt: skip
    return nvim.lua(f"return {GHOST}.shown()")


def test_every_update_reaches_the_ghost_and_it_ends_as_the_final_answer(nvim: Nvim):
    version = new_comment(nvim, "# growth ")
    early = nvim.wait_for("the early answer", f"{GHOST}.shown()", 120, diagnose=lambda: diagnose(nvim))
    shown = wait_settled(nvim, version, "the final answer shown without a keystroke")
    final = nvim.lua(ANSWER)
    assert shown["items"] == final, (shown, final)
    assert shown["text"] == final[shown["index"] - 1]
    assert marks(nvim) == (shown["text"].split("\n")[0], f" ({shown['index']}/{len(final)})")
    # it grew: the early answer was shorter than the final one (else this test could not fail)
    assert len(shown["text"]) > len(early["text"]) and shown["text"].startswith(early["text"]), (early, shown)
    # every notification for this text asked again (each interim one and the final one)
    updates = nvim.lua("return _G.kspec_log.updated")
    assert updates and all(u["asked"] is True and u["version"] == version for u in updates), updates
    assert nvim.lua(f"return {GHOST}._debug().refreshes") >= len(updates)
    assert nvim.lua("return vim.api.nvim_get_current_line()") == "# growth "  # nothing typed or inserted


def test_next_while_decoding_joins_the_final_answer_whose_k_distinct_alternatives_all_cycle(nvim: Nvim):
    version = new_comment(nvim, "# cycle ")
    # next pressed (the mapping's own call) as soon as the early answer is shown while the
    # server decodes on: checked and pressed in one call, nothing can arrive in between
    pressed = nvim.wait_for(
        "the early answer while the server decodes", "_G.press_while_decoding(a[1])", 120, version, diagnose=lambda: diagnose(nvim),
    )  # fmt: skip
    at_press = pressed["shown"]
    assert pressed["joining"] is True and at_press["index"] == 1, pressed  # not a step over the interim alternatives
    assert marks(nvim)[1] == f" (1/{at_press['count']} …)"

    shown = wait_settled(nvim, version, "the joined step over the final alternatives")
    final = nvim.lua(ANSWER)
    assert shown["items"] == final, (shown, final)
    assert shown["index"] == 2 and shown["text"] == final[1], shown  # the final answer's second
    assert marks(nvim) == (final[1].split("\n")[0], f" (2/{len(final)})")

    # k means k: the server's final answer had k distinct alternatives, and each one is
    # reached by next (a user's keys), once, before coming back round
    alternatives = nvim.lua("return require('kspec.status').current().alternatives")
    assert alternatives == {"count": K, "k": K}, alternatives
    assert len(final) == K and len(set(final)) == K, final
    seen = [shown["text"]]
    for i in range(K):
        nvim.input("<M-]>")
        expected = (shown["index"] + i) % K + 1
        seen.append(nvim.wait_for(f"alternative {expected}", f"{GHOST}.shown().index == a[1] and {GHOST}.shown().text", 10, expected))
    assert seen[-1] == seen[0] and sorted(seen[:-1]) == sorted(final), seen
    nvim.input("<M-[>")
    nvim.wait_for("the previous alternative", f"{GHOST}.shown().index == 1", 10)
    assert nvim.lua("return vim.api.nvim_get_current_line()") == "# cycle "


DISMISS_WHILE_DECODING = f"""
function _G.dismiss_while_decoding(version)
  local a = {{ version }}
  if _G.pressed == nil and {GHOST}.shown() ~= nil and {DECODING} and not ({FINAL_SEEN}) then
    require('kspec')._key('dismiss')
    _G.pressed = {{ updates = #_G.kspec_log.updated }}
  end
  return _G.pressed or false
end
"""


def test_a_suggestion_dismissed_while_the_server_decodes_stays_dismissed(nvim: Nvim):
    """Dismissed (the mapping's own call) while the server decodes on: the later updates for
    that text, the final one too, do not show it again; a key asks again as always."""
    nvim.lua(DISMISS_WHILE_DECODING)
    version = new_comment(nvim, "# gone ")
    pressed = nvim.wait_for(
        "the early answer while the server decodes", "_G.dismiss_while_decoding(a[1])", 120, version, diagnose=lambda: diagnose(nvim),
    )  # fmt: skip
    nvim.wait_for("the final update", FINAL_SEEN, 120, version, diagnose=lambda: diagnose(nvim) + f"\nrecorded: {nvim.lua('return _G.kspec_log')}")
    later = nvim.lua("return _G.kspec_log.updated")[pressed["updates"] :]
    assert later and all(u["asked"] is False for u in later), later
    assert nvim.lua(f"return {GHOST}.shown()") is None and nvim.lua(f"return #{MARKS}") == 0
    nvim.input("x")
    nvim.wait_for("a suggestion after a key", f"{GHOST}.shown() ~= nil", 120, diagnose=lambda: diagnose(nvim))


def test_the_statusline_is_busy_while_the_server_decodes_and_idle_only_when_nothing_does(nvim: Nvim):
    version = new_comment(nvim, "# status ")
    # the early answer is on screen while the server decodes on: busy, not the answer's latency
    line = nvim.wait_for(
        "the early answer while the server decodes",
        f"{GHOST}.shown() ~= nil and {DECODING} and not ({FINAL_SEEN}) and require('kspec').statusline()",
        120, version, diagnose=lambda: diagnose(nvim),
    )  # fmt: skip
    assert line == "kspec busy"
    wait_settled(nvim, version, "the final answer")
    nvim.wait_for("the idle status", "#_G.kspec_log.status > 0 and #_G.kspec_log.status[#_G.kspec_log.status].decoding == 0", 30)
    statuses = nvim.lua("return _G.kspec_log.status")
    assert any(s["decoding"] for s in statuses), statuses  # the server said it decoded
    for s in statuses:  # each status of the ready engine as the plugin showed it (loading shows its progress)
        if s["state"] != "ready":
            continue
        busy = bool(s["decoding"]) or s["activity"] == "busy"
        assert (s["line"] == "kspec busy") == busy, statuses
    assert statuses[-1]["line"].startswith("kspec ") and statuses[-1]["line"] != "kspec busy", statuses

    # a status that lists a document as decoding is busy whatever its activity says
    current = nvim.lua("return require('kspec.status').current()")
    text = "return require('kspec.status').text(require('kspec.status').parse(...), true)"
    told = {"state": "ready", "message": "ready", "latencyMs": 12.0, "activity": "idle"}
    assert nvim.lua(text, {**told, "decoding": ["file:///elsewhere/other.py"]}) == "kspec busy"
    assert nvim.lua(text, {**told, "decoding": []}) == "kspec 12ms"
    assert current["state"] == "ready"


def test_an_item_taken_from_the_completion_menu_is_continued_by_the_next_ghost(nvim: Nvim):
    """Neovim's popup menu inserts the item it selects (Ctrl-N); the ghost is hidden while the
    menu is open (its keys are the menu's). Once the item is taken (Ctrl-Y) the ghost comes
    back without another keystroke, for the line with the item in it."""
    new_comment(nvim, "# menu ")
    nvim.wait_for("a ghost", f"{GHOST}.shown()", 120, diagnose=lambda: diagnose(nvim))
    nvim.input("<C-n>")
    nvim.wait_for("the popup menu, the ghost hidden", f"vim.fn.pumvisible() == 1 and #{MARKS} == 0", 10)
    nvim.input("<C-y>")
    nvim.wait_for("the menu closed", "vim.fn.pumvisible() == 0", 10)
    line = nvim.lua("return vim.api.nvim_get_current_line()")
    assert line != "# menu " and line.startswith("# menu ")  # the item is in the line
    shown = nvim.wait_for("a ghost for the line with the item", f"{GHOST}.shown() ~= nil and #{MARKS} > 0 and {GHOST}.shown()", 60, diagnose=lambda: diagnose(nvim))
    # asked at the end of the item: the ghost continues the text the menu put there
    assert nvim.lua(f"return {GHOST}._debug().anchor") == {"row": 0, "col": len(line.encode())}
    assert shown["text"] and marks(nvim)[0] == shown["text"].split("\n")[0]
    assert nvim.lua("return vim.api.nvim_get_current_line()") == line
