"""The Neovim plugin (editors/nvim) in a real headless Neovim, driven like a user
types (nvim_input), against the real `kspec lsp` with a tiny random model.

Every wait polls the plugin's extmarks or state with a deadline; none sleeps."""

from __future__ import annotations

import contextlib
import json
import re
import os
import threading
from pathlib import Path
from typing import Iterator

import pytest

from loopback_http import JsonHandler, LoopbackServer
from nvim_rpc import Nvim

REPO = Path(__file__).resolve().parents[2]

PLUGIN = Path(os.environ.get("KSPEC_NVIM_PLUGIN") or REPO / "editors" / "nvim")  # another copy: to check a test fails without a fix
K = 3
FIRST_LINE = "# "  # a comment: all k gibberish alternatives survive the server's syntax checks
TEXT = "\ndef add(a, b):\n    return a + b\n"

GHOST = "require('kspec.ghost')"
MARKS = f"vim.api.nvim_buf_get_extmarks(0, {GHOST}.namespace, 0, -1, {{ details = true }})"


@contextlib.contextmanager
def started_nvim(root: Path, nvim_bin: str, kspec_bin: Path, settings: dict, env_extra: dict[str, str] | None = None) -> Iterator[Nvim]:
    """A headless Neovim in root/project with require('kspec').setup({ settings = settings }),
    example.py open and the kspec client attached."""
    project = root / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (project / "example.py").write_text(TEXT)
    env = dict(os.environ)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(root / var.lower())
    # found the way a user's shell has it: through the active virtual environment
    env["VIRTUAL_ENV"] = str(kspec_bin.parent.parent)
    env.update(env_extra or {})
    editor = Nvim([nvim_bin, "--embed", "--headless", "--clean", "-n", "--cmd", f"set rtp^={PLUGIN}"], cwd=str(project), env=env)
    editor.log_path = root / "xdg_state_home" / "nvim" / "lsp.log"  # type: ignore[attr-defined]
    try:
        problems = editor.lua("require('kspec').setup(...); return require('kspec').problems", {"settings": settings, "ghost": {"debounce_ms": 20}})
        assert problems == []
        editor.request("nvim_command", "edit example.py")
        editor.wait_for("the kspec client to attach", "#vim.lsp.get_clients({ name = 'kspec', bufnr = 0 }) > 0", 60, diagnose=lambda: diagnose(editor))
        yield editor
    finally:
        editor.close()


@pytest.fixture(scope="module")
def nvim(tmp_path_factory, nvim_bin, kspec_bin, random_llama_dir):
    settings = {"model": str(random_llama_dir), "k": K, "maxTokens": 8, "debounceMs": 0, "deadlineMs": 60000, "engine": "inprocess"}
    with started_nvim(tmp_path_factory.mktemp("nvim"), nvim_bin, kspec_bin, settings) as editor:
        # one answer per request: these tests compare what is shown with the first answer,
        # which an early answer's refresh ($/kspec/suggestionsUpdated) would replace under them
        editor.lua("require('kspec').set({ firstAnswerMs = 0 })")
        yield editor


def diagnose(editor: Nvim) -> str:
    parts = []
    try:
        parts.append("messages: " + str(editor.request("nvim_exec2", "messages", {"output": True}, timeout=5).get("output")))
        parts.append("ghost: " + json.dumps(editor.lua(f"return {GHOST}._debug()", timeout=5)))
        parts.append("status: " + json.dumps(editor.lua("return require('kspec.status').current()", timeout=5)))
    except Exception as exc:  # the editor may be the thing that broke
        parts.append(f"(editor not answering: {exc})")
    log = getattr(editor, "log_path", None)
    if log and Path(log).exists():
        parts.append("lsp.log tail:\n" + Path(log).read_text(errors="replace")[-3000:])
    parts.append("nvim stderr: " + editor.stderr.decode(errors="replace")[-1000:])
    return "\n".join(parts)


def fresh_comment_line(nvim: Nvim) -> None:
    """Normal mode, a new first line, then type FIRST_LINE in insert mode."""
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    nvim.request("nvim_buf_set_lines", 0, 0, -1, False, TEXT.split("\n")[:-1])
    nvim.request("nvim_win_set_cursor", 0, [1, 0])
    nvim.input("i" + FIRST_LINE)


def wait_ghost(nvim: Nvim) -> dict:
    nvim.wait_for("ghost text", f"#{MARKS} > 0 and {GHOST}.shown() ~= nil", 120, diagnose=lambda: diagnose(nvim))
    return nvim.lua(f"return {GHOST}.shown()")


def marks(nvim: Nvim) -> tuple[str, str]:
    """(ghost text of the first line, the counter) as drawn in the buffer."""
    drawn = nvim.lua(f"return {MARKS}")
    texts = {m[3]["virt_text_pos"]: "".join(chunk[0] for chunk in m[3]["virt_text"]) for m in drawn}
    return texts["inline"], texts["eol"]


def kspec_bin_from(nvim: Nvim) -> str:
    return nvim.lua("return vim.env.VIRTUAL_ENV") + "/bin/kspec"


def buffer(nvim: Nvim) -> list[str]:
    return nvim.request("nvim_buf_get_lines", 0, 0, -1, False)


def test_ghost_text_appears_cycles_and_tab_accepts_the_chosen_alternative(nvim: Nvim):
    fresh_comment_line(nvim)
    shown = wait_ghost(nvim)
    assert shown["count"] == K and shown["index"] == 1
    items = shown["items"]
    assert len(set(items)) == K, items
    assert marks(nvim) == (items[0].split("\n")[0], f" (1/{K})")

    nvim.input("<M-]>")
    nvim.wait_for("the 2nd alternative", f"{GHOST}.shown().index == 2", 10)
    assert marks(nvim) == (items[1].split("\n")[0], f" (2/{K})")
    nvim.input("<M-[><M-[>")  # 2 -> 1 -> wraps to K
    nvim.wait_for("the last alternative", f"{GHOST}.shown().index == {K}", 10)
    assert marks(nvim) == (items[K - 1].split("\n")[0], f" ({K}/{K})")
    nvim.input("<M-]><M-]>")  # K -> 1 -> 2
    nvim.wait_for("the 2nd alternative again", f"{GHOST}.shown().index == 2", 10)
    chosen = items[1]

    before = buffer(nvim)
    nvim.input("<Tab>")
    expected_first = (FIRST_LINE + chosen).split("\n")
    expected = expected_first[:-1] + [expected_first[-1] + before[0][len(FIRST_LINE):]] + before[1:]
    nvim.wait_for(
        "the accepted alternative in the buffer",
        "vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), a[1])",
        10,
        expected,
        diagnose=lambda: f"buffer: {buffer(nvim)!r}\nexpected: {expected!r}",
    )
    assert buffer(nvim) == expected
    # the cursor sits after the inserted text, still in insert mode
    row, col = nvim.request("nvim_win_get_cursor", 0)
    assert row == len(expected_first)
    assert col == len(expected_first[-1].encode())
    assert nvim.request("nvim_get_mode")["mode"] == "i"


def test_typing_what_is_shown_keeps_the_rest_without_a_new_request(nvim: Nvim):
    fresh_comment_line(nvim)
    shown = wait_ghost(nvim)
    text = shown["text"]
    first = text[0]
    assert first != "\n", "the comment alternatives start on the same line"
    seq = nvim.lua(f"return {GHOST}._debug().seq")
    nvim.input("<lt>" if first == "<" else first)
    nvim.wait_for("the ghost text to follow the typed character", f"{GHOST}.shown() ~= nil and {GHOST}.shown().text == a[1]", 10, text[1:])
    assert buffer(nvim)[0] == FIRST_LINE + first
    assert nvim.lua(f"return {GHOST}._debug().seq") == seq  # no request was made


def test_accept_word_inserts_one_word_and_keeps_showing_the_rest(nvim: Nvim):
    fresh_comment_line(nvim)
    text = wait_ghost(nvim)["text"]
    nvim.input("<M-Right>")
    nvim.wait_for("a partial accept", "vim.api.nvim_get_current_line() ~= a[1]", 10, FIRST_LINE)
    line = buffer(nvim)[0]
    accepted = line[len(FIRST_LINE):]
    assert accepted and text.startswith(accepted) and len(accepted) < len(text)
    assert accepted.strip() and " " not in accepted.strip(), f"one word, got {accepted!r}"
    rest = nvim.lua(f"return {GHOST}.shown()")
    assert rest is not None and accepted + rest["text"] == text


def test_accept_line_and_dismiss(nvim: Nvim):
    fresh_comment_line(nvim)
    text = wait_ghost(nvim)["text"]
    assert "\n" not in text  # comment alternatives are one line: accepting the line takes it all
    nvim.input("<M-C-Right>")
    nvim.wait_for("the line accepted", "vim.api.nvim_get_current_line() == a[1]", 10, FIRST_LINE + text)

    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<C-]>")
    nvim.wait_for("the ghost text dismissed", f"#{MARKS} == 0 and {GHOST}.shown() == nil", 10)
    assert buffer(nvim)[0] == FIRST_LINE
    assert nvim.request("nvim_get_mode")["mode"] == "i"


def test_moving_the_cursor_or_leaving_insert_mode_hides_and_cancels(nvim: Nvim):
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<Left>")
    nvim.wait_for("the ghost text to go on CursorMovedI", f"#{MARKS} == 0 and {GHOST}._debug().anchor == nil", 10)

    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<Esc>")
    nvim.wait_for("the ghost text to go on InsertLeave", f"#{MARKS} == 0 and {GHOST}._debug().anchor == nil", 10)

    # a request still waiting out its debounce is dropped by a cursor move
    nvim.lua("require('kspec').opts.ghost.debounce_ms = 600000")
    try:
        fresh_comment_line(nvim)
        nvim.wait_for("a debounced request", f"{GHOST}._debug().anchor ~= nil", 10)
        nvim.input("<Left>")
        nvim.wait_for("the debounced request to be dropped", f"{GHOST}._debug().anchor == nil and not {GHOST}._debug().pending", 10)
    finally:
        nvim.lua("require('kspec').opts.ghost.debounce_ms = 20")


def test_tab_is_a_normal_tab_when_nothing_is_shown(nvim: Nvim):
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    assert nvim.lua("return vim.fn.maparg('<Tab>', 'i', false, true).buffer") == 1  # our mapping is there
    nvim.lua("require('kspec').enable(false)")
    try:
        nvim.request("nvim_buf_set_lines", 0, 0, -1, False, ["x = 1", ""])
        nvim.request("nvim_win_set_cursor", 0, [2, 0])
        nvim.input("i<Tab>")
        # python's ftplugin: expandtab, softtabstop 4
        nvim.wait_for("a normal <Tab>", "vim.api.nvim_get_current_line() == '    '", 10)
        # off means off: asking explicitly (<M-]>) does not even start a request
        nvim.input("<M-]>")
        assert nvim.lua(f"return {GHOST}._debug().anchor") is None
        assert nvim.lua("return vim.lsp.get_clients({ name = 'kspec' })[1].settings.enabled") is False
    finally:
        nvim.lua("require('kspec').enable(true)")


def test_a_completion_menu_hides_the_ghost_and_tab_never_applies_it(nvim: Nvim):
    """Issue 16, 1: Ctrl-N over a shown suggestion, then Tab, then Esc corrupted the line."""
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<C-n>")
    nvim.wait_for("the popup menu", "vim.fn.pumvisible() == 1", 10)
    nvim.wait_for("the ghost text hidden while the menu is open", f"#{MARKS} == 0 and {GHOST}.shown() == nil", 10)
    completed = nvim.lua("return vim.api.nvim_get_current_line()")
    assert completed != FIRST_LINE  # Ctrl-N inserted its first match (no TextChangedI for it)
    nvim.input("<Tab><Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    assert re.fullmatch(re.escape(completed) + r"[ \t]+", buffer(nvim)[0]), buffer(nvim)[0]  # Tab did what it does without kspec (Python: spaces)


def test_tab_never_applies_a_suggestion_made_for_another_line_state(nvim: Nvim):
    """A change no autocommand reported (a plugin's edit with events ignored): the ghost
    shown was made for the line before it, so Tab is a plain Tab."""
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.lua("vim.o.eventignore = 'all'; vim.api.nvim_buf_set_text(0, 0, 2, 0, 2, { 'zz' }); vim.api.nvim_win_set_cursor(0, { 1, 4 })")
    try:
        nvim.input("<Tab>")
        nvim.wait_for("the Tab typed", "vim.api.nvim_get_current_line() ~= a[1]", 10, FIRST_LINE + "zz")
        assert re.fullmatch(re.escape(FIRST_LINE + "zz") + r"[ \t]+", buffer(nvim)[0]), buffer(nvim)[0]
    finally:
        nvim.lua("vim.o.eventignore = ''")
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)


def inject_status(nvim: Nvim, params: dict) -> None:
    """A `$/kspec/status` notification, delivered to the handler the plugin registered."""
    nvim.lua(
        "local params = ...; local client = vim.lsp.get_clients({ name = 'kspec', bufnr = 0 })[1];"
        " client.handlers['$/kspec/status'](nil, params, { method = '$/kspec/status', client_id = client.id })",
        params,
    )


def test_the_engine_turning_ready_asks_again_without_a_keystroke(nvim: Nvim):
    """A request made while the model loads got nothing; when the status turns ready the
    plugin asks again by itself (no keystroke) and the ghost appears."""
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<C-]>")
    nvim.wait_for("the ghost text dismissed", f"#{MARKS} == 0 and {GHOST}.shown() == nil", 10)
    ready = nvim.lua("return require('kspec.status').current()")
    requests = server_requests(nvim)
    inject_status(nvim, {**ready, "state": "loading", "message": "loading the model"})
    assert server_requests(nvim) == requests  # nothing asked while loading
    inject_status(nvim, ready)
    wait_ghost(nvim)
    assert server_requests(nvim) == requests + 1 and buffer(nvim)[0] == FIRST_LINE
    inject_status(nvim, ready)  # ready again while ready, a suggestion shown: no new request
    assert server_requests(nvim) == requests + 1


def test_kspec_log_opens_the_engine_log_and_the_lsp_log(nvim: Nvim, tmp_path: Path):
    engine_log = tmp_path / "engine.log"
    engine_log.write_text("kspec-engine INFO listening\n")
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    current = nvim.lua("return require('kspec.status').current()")
    inject_status(nvim, {**current, "logFile": str(engine_log)})
    nvim.request("nvim_command", "KspecLog")
    try:
        names = nvim.lua("return vim.tbl_map(function(w) return vim.api.nvim_buf_get_name(vim.api.nvim_win_get_buf(w)) end, vim.api.nvim_tabpage_list_wins(0))")
        assert names == [str(engine_log), nvim.lua("return vim.lsp.get_log_path()")]
    finally:
        nvim.request("nvim_command", "tabclose")
        inject_status(nvim, current)


UPDATED = "$/kspec/suggestionsUpdated"


def notify_updated(nvim: Nvim, version: int | None = None, uri: str | None = None) -> bool:
    """The server's notification that longer alternatives for (uri, version) are in its
    typeahead cache, delivered to the handler the plugin registered on its kspec client
    (default: the current buffer at its current version). -> whether it asked again."""
    return nvim.lua(
        """
        local version, uri = ...
        local client = vim.lsp.get_clients({ name = 'kspec', bufnr = 0 })[1]
        local bufnr = vim.api.nvim_get_current_buf()
        local params = {
          uri = (uri == nil or uri == vim.NIL) and vim.uri_from_bufnr(bufnr) or uri,
          version = (version == nil or version == vim.NIL) and vim.lsp.util.buf_versions[bufnr] or version,
        }
        return client.handlers[a_method](nil, params, { method = a_method, client_id = client.id, bufnr = bufnr })
        """.replace("a_method", repr(UPDATED)),
        version,
        uri,
    )


def document_version(nvim: Nvim) -> int:
    return nvim.lua("return vim.lsp.util.buf_versions[vim.api.nvim_get_current_buf()]")


def server_stats(nvim: Nvim) -> dict:
    """The server's counters (kspec/stats): requests, typeahead_hits, engine_calls, ..."""
    return nvim.lua("local r = vim.lsp.get_clients({ name = 'kspec' })[1]:request_sync('kspec/stats', vim.empty_dict(), 10000, 0); assert(r and r.result, vim.inspect(r)); return r.result")


def server_requests(nvim: Nvim) -> int:
    return server_stats(nvim)["requests"]


def wait_refreshed(nvim: Nvim, seq: int) -> dict:
    nvim.wait_for(
        "the answer to the request asked again", f"{GHOST}._debug().seq == a[1] and not {GHOST}._debug().pending and {GHOST}.shown() ~= nil",
        60, seq, diagnose=lambda: diagnose(nvim),
    )  # fmt: skip
    return nvim.lua(f"return {GHOST}.shown()")


def test_longer_suggestions_ready_for_this_version_asks_again_and_keeps_the_alternative(nvim: Nvim):
    fresh_comment_line(nvim)
    items = wait_ghost(nvim)["items"]
    nvim.input("<M-]>")
    nvim.wait_for("the 2nd alternative", f"{GHOST}.shown().index == 2", 10)
    seq, requests = nvim.lua(f"return {GHOST}._debug().seq"), server_requests(nvim)
    # not for this text: an older version of the buffer, another document
    assert notify_updated(nvim, document_version(nvim) - 1) is False
    assert notify_updated(nvim, uri="file:///elsewhere/other.py") is False
    assert nvim.lua(f"return {GHOST}._debug().seq") == seq

    assert notify_updated(nvim) is True
    now = wait_refreshed(nvim, seq + 1)
    assert server_requests(nvim) == requests + 1  # a new request reached the server (its typeahead cache answers it)
    # still the alternative the user was looking at (its longer version, when there is one)
    assert now["text"].startswith(items[1]), (now, items)
    assert now["index"] == next(i for i, text in enumerate(now["items"], 1) if text.startswith(items[1]))
    assert marks(nvim) == (now["text"].split("\n")[0], f" ({now['index']}/{now['count']})")


def test_typed_into_the_suggestion_its_requests_notification_still_asks_again(nvim: Nvim):
    fresh_comment_line(nvim)
    text = wait_ghost(nvim)["text"]
    asked_at = document_version(nvim)
    first = text[0]
    nvim.input("<lt>" if first == "<" else first)
    nvim.wait_for("the ghost text to follow the typed character", f"{GHOST}.shown() ~= nil and {GHOST}.shown().text == a[1]", 10, text[1:])
    assert document_version(nvim) != asked_at
    seq = nvim.lua(f"return {GHOST}._debug().seq")
    assert notify_updated(nvim, asked_at) is True  # the answer shown is that request's
    now = wait_refreshed(nvim, seq + 1)
    assert now["text"].startswith(text[1:]), (now, text)  # the server's typeahead cache answers for the text as typed
    assert nvim.lua(f"return {GHOST}._debug().typed") == ""
    assert buffer(nvim)[0] == FIRST_LINE + first

    # out of insert mode nothing is asked
    nvim.input("<Esc>")
    nvim.wait_for("normal mode", "vim.api.nvim_get_mode().mode == 'n'", 10)
    assert notify_updated(nvim) is False


def test_the_servers_longer_answer_replaces_its_early_one_without_a_keystroke(tmp_path: Path, nvim_bin: str, kspec_bin: Path, random_llama_dir: Path):
    """End to end: the server answers early (at the end of the prefill), decodes on, sends
    $/kspec/suggestionsUpdated; the plugin asks again by itself and shows the answer its
    typeahead cache gives."""
    settings = {"model": str(random_llama_dir), "k": K, "maxTokens": 24, "debounceMs": 0, "deadlineMs": 60000, "engine": "inprocess"}
    with started_nvim(tmp_path, nvim_bin, kspec_bin, settings) as editor:
        editor.lua("require('kspec').set({ firstAnswerMs = 1 })")  # an early answer at the end of the prefill
        fresh_comment_line(editor)
        editor.wait_for(
            "the plugin to ask again after the server's notification",
            f"{GHOST}._debug().refreshes >= 1 and not {GHOST}._debug().pending and {GHOST}.shown() ~= nil", 120,
            diagnose=lambda: diagnose(editor) + f"\nstats: {server_stats(editor)}",
        )  # fmt: skip
        stats = server_stats(editor)
        # told of grown alternatives while decoding went on (at most every 300 ms), or of the final ones
        assert stats["early_answers"] >= 1 and stats["continued"] + stats["interim_updates"] >= 1, stats
        assert stats["typeahead_hits"] >= 1, stats  # the request asked again was answered from the cache
        assert buffer(editor)[0] == FIRST_LINE  # nothing was typed or inserted
        shown = editor.lua(f"return {GHOST}.shown()")
        assert marks(editor)[0] == shown["text"].split("\n")[0]


def test_status_and_checkhealth_report_server_engine_and_features(nvim: Nvim):
    fresh_comment_line(nvim)
    wait_ghost(nvim)
    nvim.input("<Esc>")
    line = nvim.lua("return require('kspec').statusline()")
    assert re.fullmatch(r"kspec \d+(ms|\.\ds)", line), line  # ready, with the last latency
    assert nvim.lua("return require('kspec.status').current().state") == "ready"
    nvim.request("nvim_command", "checkhealth kspec")
    report = "\n".join(buffer(nvim))
    nvim.request("nvim_command", "bwipeout!")
    assert "OK Neovim 0.11" in report
    assert "vim.lsp.config / vim.lsp.enable (0.11+): yes" in report
    assert "vim.lsp.inline_completion (0.12+): no" in report
    assert "completions are shown by kspec ghost text" in report
    assert f"server command: {kspec_bin_from(nvim)} lsp ($VIRTUAL_ENV)" in report
    assert "engine: ready" in report
    assert "inline completion yes" in report
    # the server's pid, not "client 1 (pid ?)"
    pid = re.search(r"client \d+: kspec lsp pid (\d+)", report)
    assert pid, report
    assert b"kspec" in Path(f"/proc/{pid.group(1)}/cmdline").read_bytes()
    assert "logs (:KspecLog): kspec lsp stderr in " in report


def test_network_engine_settings_are_checked_by_type(nvim: Nvim):
    check = "local opts, problems = require('kspec.config').resolve({ settings = ... }); return { opts.settings, problems }"
    good = {
        "engine": "remote", "engineUrl": "tls://gpu-box:8443", "engineTokenFile": "~/.config/kspec/token",
        "engineCaFile": "~/.config/kspec/ca.pem", "remoteModel": "qwen2.5-coder", "remoteFim": "suffix",
    }
    settings, problems = nvim.lua(check, good)
    assert (settings, problems) == (good, [])
    # nullable keys take vim.NIL (JSON null); the others do not
    nulls = nvim.lua(
        "local o, p = require('kspec.config').resolve({ settings = { engineUrl = vim.NIL, engineTokenFile = vim.NIL, engineCaFile = vim.NIL,"
        " remoteModel = vim.NIL, engine = vim.NIL, remoteFim = vim.NIL } }); return { vim.tbl_keys(o.settings), p }"
    )
    assert sorted(nulls[0]) == ["engineCaFile", "engineTokenFile", "engineUrl", "remoteModel"]
    assert sorted(nulls[1]) == ["settings.engine: expected string, got userdata; dropped", "settings.remoteFim: expected string, got userdata; dropped"]
    bad = {"engine": 1, "engineUrl": 8000, "engineTokenFile": True, "engineCaFile": [1], "remoteModel": 2, "remoteFim": False}
    settings, problems = nvim.lua(check, bad)
    assert settings == [] or settings == {}  # all dropped (an empty Lua table comes back as a list)
    assert sorted(problems) == sorted(
        f"settings.{key}: expected {'string' if key in ('engine', 'remoteFim') else 'string or nil'}, got {kind}; dropped"
        for key, kind in [("engine", "number"), ("engineUrl", "number"), ("engineTokenFile", "boolean"), ("engineCaFile", "table"), ("remoteModel", "number"), ("remoteFim", "boolean")]
    )


class FakeOpenAI(LoopbackServer):
    """An OpenAI-compatible completions server on loopback that records what it is asked:
    what a team's vLLM / llama.cpp server would see from the editor's kspec lsp."""

    MODELS = ["first-model", "fake-coder"]
    TEXTS = ["team engine one", "team engine two", "team engine three"]

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict | None, str | None]] = []  # (method, path, body, authorization)
        self._cond = threading.Condition()
        fake = self

        class Handler(JsonHandler):
            def _record(self, body: dict | None) -> None:
                with fake._cond:
                    fake.requests.append((self.command, self.path, body, self.headers.get("Authorization")))
                    fake._cond.notify_all()

            def do_GET(self) -> None:
                self._record(None)
                self.answer_json({"object": "list", "data": [{"id": m, "object": "model"} for m in fake.MODELS]})

            def do_POST(self) -> None:
                body = self.read_json()
                self._record(body)
                choices = [{"index": i, "text": text, "finish_reason": "stop"} for i, text in enumerate(fake.TEXTS[: body.get("n", 1)])]
                self.answer_json({"id": "cmpl-1", "object": "text_completion", "model": body.get("model"), "choices": choices})

        super().__init__(Handler)

    def wait_for(self, what: str, predicate, timeout: float) -> tuple:
        """The first recorded request for which predicate(method, path, body, authorization) is true."""
        def found():
            return next((r for r in self.requests if predicate(*r)), None)

        with self._cond:
            if not self._cond.wait_for(found, timeout):
                raise TimeoutError(f"the fake engine saw no {what}; it saw {self.requests!r:.3000}")
            return found()


def test_a_team_engine_on_the_network_from_the_documented_settings(tmp_path: Path, nvim_bin: str, kspec_bin: Path):
    """The doc's team setup (engine 'openai', engineUrl, engineTokenFile under ~) plus
    remoteModel / remoteFim reach the server as initializationOptions, and vim.NIL sent
    with set() resets a nullable key to the server's default."""
    home = tmp_path / "home"
    (home / ".config" / "kspec").mkdir(parents=True)
    (home / ".config" / "kspec" / "token").write_text("team-secret\n")
    fake = FakeOpenAI()
    fim = "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"
    settings = {
        "engine": "openai", "engineUrl": fake.url, "engineTokenFile": "~/.config/kspec/token",
        "remoteModel": "fake-coder", "remoteFim": fim, "k": K, "debounceMs": 0, "deadlineMs": 60000,
    }
    env = {"HOME": str(home), "KSPEC_ENGINE_TOKEN": "", "OPENAI_API_KEY": ""}
    try:
        with started_nvim(tmp_path, nvim_bin, kspec_bin, settings, env) as editor:
            sent = editor.lua("return vim.lsp.get_clients({ name = 'kspec' })[1].settings")
            assert {key: sent.get(key) for key in settings} == settings
            fake.wait_for("GET /v1/models", lambda method, path, body, auth: (method, path) == ("GET", "/v1/models"), 60)
            assert all(auth == "Bearer team-secret" for *_, auth in fake.requests), fake.requests

            fresh_comment_line(editor)
            shown = wait_ghost(editor)
            assert shown["count"] == K
            assert sorted(shown["items"]) == sorted(FakeOpenAI.TEXTS)
            _, path, body, auth = fake.wait_for("a completion request", lambda method, path, *_: method == "POST", 10)
            assert (path, auth, body["model"], body["n"]) == ("/v1/completions", "Bearer team-secret", "fake-coder", K)
            assert "suffix" not in body
            assert body["prompt"] == fim.replace("{prefix}", FIRST_LINE).replace("{suffix}", TEXT)  # the buffer before / after the cursor

            # vim.NIL is JSON null: remoteModel back to "the first model the server lists"
            editor.input("<Esc>")
            editor.lua("require('kspec').set({ remoteModel = vim.NIL })")
            assert editor.lua("return vim.lsp.get_clients({ name = 'kspec' })[1].settings.remoteModel == vim.NIL") is True
            editor.wait_for("the engine ready with the first listed model", "(require('kspec.status').current() or {}).model == 'first-model'", 60, diagnose=lambda: diagnose(editor))
            editor.request("nvim_buf_set_lines", 0, 0, -1, False, TEXT.split("\n")[:-1])
            editor.request("nvim_win_set_cursor", 0, [1, 0])
            editor.input("i# another ")
            wait_ghost(editor)
            fake.wait_for("a completion request for the first listed model", lambda method, path, body, auth: method == "POST" and body["model"] == "first-model", 10)
    finally:
        fake.close()


def test_an_engine_error_shows_and_a_fixed_setting_recovers(nvim: Nvim, random_llama_dir: Path, tmp_path: Path):
    # run last: it reloads the engine
    missing = tmp_path / "no-such-model"
    nvim.lua("require('kspec').set({ model = ... })", str(missing))
    nvim.wait_for("an error in the statusline", "require('kspec').statusline() == 'kspec error'", 60, diagnose=lambda: diagnose(nvim))
    message = nvim.lua("return require('kspec.status').current().message")
    assert message, "the error says what went wrong"
    nvim.input("<Esc>")
    nvim.request("nvim_command", "checkhealth kspec")
    report = "\n".join(buffer(nvim))
    nvim.request("nvim_command", "bwipeout!")
    assert "ERROR engine: error" in report, report
    nvim.lua("require('kspec').set({ model = ... })", str(random_llama_dir))
    nvim.wait_for("the engine ready again", "require('kspec.status').current().state == 'ready'", 120, diagnose=lambda: diagnose(nvim))
    fresh_comment_line(nvim)
    assert wait_ghost(nvim)["count"] == K


STATUSLINE = "%{v:lua.require'kspec'.statusline()}"


def test_on_a_terminal_without_truecolor_the_ghost_is_grey_and_the_statusline_follows_the_engine(tmp_path: Path, nvim_bin: str, kspec_bin: Path, random_llama_dir: Path):
    """Issue 16, 2 and 4: a UI without true colour (as in tmux) sees the suggestion and its
    counter in a colour of their own; the statusline is redrawn on each status change."""
    settings = {"model": str(random_llama_dir), "k": K, "maxTokens": 8, "debounceMs": 0, "deadlineMs": 60000, "engine": "inprocess", "firstAnswerMs": 0}
    with started_nvim(tmp_path, nvim_bin, kspec_bin, settings) as editor:
        screen = editor.attach_screen(100, 20)
        editor.lua(f"vim.o.termguicolors = false; vim.o.laststatus = 2; vim.o.statusline = {STATUSLINE!r}")
        status_row = 18  # above the command line

        fresh_comment_line(editor)
        shown = wait_ghost(editor)
        width = min(5, len(shown["text"].split("\n")[0]))
        assert width > 0
        row = screen.wait_for("the ghost text drawn", lambda: screen.line(0).rstrip() != FIRST_LINE.rstrip() and screen.cells(0), 30)
        typed_attrs = row[0][1]  # "#": the line's own text (a comment: no terminal colour in the default scheme)
        ghost_cells = row[len(FIRST_LINE) : len(FIRST_LINE) + width]
        assert all(attrs.get("foreground") is not None for _, attrs in ghost_cells), (ghost_cells, typed_attrs)
        assert ghost_cells[0][1] != typed_attrs  # not the colour of the code
        count = f" (1/{shown['count']})"
        counted = [(r, screen.line(r).find(count)) for r in range(4) if count in screen.line(r)]
        assert counted, "the counter is drawn"
        (count_row, start), *_ = counted
        assert all(attrs.get("foreground") is not None for _, attrs in screen.cells(count_row)[start + 1 : start + len(count)])

        # the statusline shows this answer's latency without another keystroke
        expected = editor.lua("return require('kspec.status').text(require('kspec.status').current(), true)")
        assert re.fullmatch(r"kspec \d+(ms|\.\ds)", expected), expected
        screen.wait_for(f"{expected!r} in the statusline", lambda: screen.line(status_row).strip() == expected, 10)

        # each status change is drawn at once: loading progress, busy, timed out, ready
        current = editor.lua("return require('kspec.status').current()")
        for params, text in [
            ({"state": "loading", "message": "loading the model", "progress": 0.42}, "kspec 42%"),
            ({**current, "activity": "busy"}, "kspec busy"),
            ({**current, "activity": "timedOut"}, "kspec timed out"),
            ({**current, "activity": "idle"}, expected),
        ]:
            inject_status(editor, params)
            screen.wait_for(f"{text!r} in the statusline", lambda: screen.line(status_row).strip() == text, 10)


def test_a_missing_kspec_is_reported_once_and_the_buffer_keeps_its_highlighting(tmp_path: Path, nvim_bin: str):
    """Issue 16, 3: no `kspec` anywhere. The old error inside BufReadPost asked for ENTER and
    cost the buffer its syntax highlighting."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (project / "example.py").write_text(TEXT)
    (project / "other.py").write_text(TEXT)
    empty = tmp_path / "empty-venv"
    (empty / "bin").mkdir(parents=True)
    env = {key: value for key, value in os.environ.items() if key not in ("CONDA_PREFIX",)}
    env.update({"VIRTUAL_ENV": str(empty), "PATH": str(empty / "bin")})
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    editor = Nvim([nvim_bin, "--embed", "--headless", "--clean", "-n", "--cmd", f"set rtp^={PLUGIN}"], cwd=str(project), env=env)
    try:
        editor.attach_screen(100, 20)
        editor.lua(
            "_G.notes = {}; local notify = vim.notify;"
            " vim.notify = function(msg, level, o) table.insert(_G.notes, { msg, level }); return notify(msg, level, o) end;"
            " require('kspec').setup({})"
        )
        editor.request("nvim_command", "edit example.py")
        notes = editor.wait_for("the report", "#_G.notes > 0 and _G.notes", 10)
        assert editor.request("nvim_get_mode") == {"mode": "n", "blocking": False}  # no "Press ENTER"
        assert editor.lua("return vim.v.errmsg") == ""
        assert editor.lua("return vim.b.current_syntax") == "python"
        editor.request("nvim_command", "edit other.py")
        assert editor.lua("return vim.b.current_syntax") == "python"
        assert editor.lua("return _G.notes") == notes  # once
        (message, level), = notes
        assert "kspec" in message and "checkhealth" in message and level == 3  # WARN
        assert editor.lua("return vim.json.encode(require('kspec').server_settings())") == "{}"  # not [], which the server refused
        editor.request("nvim_command", "checkhealth kspec")
        report = "\n".join(editor.request("nvim_buf_get_lines", 0, 0, -1, False))
        assert "kspec was not found (looked at " in report and "ERROR" in report
        assert "open a file to start one" not in report and "cannot start until kspec is found" in report, report
    finally:
        editor.close()


def test_next_after_typing_into_the_suggestion_asks_for_k_at_the_typed_text(nvim: Nvim):
    """Typed into the shown alternative until no other goes on with it, one is left; Alt+]
    asks at the text as typed, the server tops the alternatives up to k (the one shown
    first, as at `return wi|`) and the step is taken over them."""
    fresh_comment_line(nvim)
    items = wait_ghost(nvim)["items"]
    first_line = items[0].split("\n")[0]
    typed = next((first_line[:n] for n in range(1, len(first_line)) if not any(o.startswith(first_line[:n]) for o in items[1:])), None)
    assert typed is not None, f"no start of {items[0]!r} sets it apart from {items[1:]!r}"
    nvim.input("".join("<lt>" if char == "<" else char for char in typed))
    nvim.wait_for("one alternative left", f"{GHOST}.shown() ~= nil and {GHOST}.shown().count == 1", 10)
    seq = nvim.lua(f"return {GHOST}._debug().seq")

    nvim.input("<M-]>")
    nvim.wait_for(
        "k alternatives at the typed text, the 2nd shown",
        f"{GHOST}.shown() ~= nil and {GHOST}.shown().count == {K} and {GHOST}.shown().index == 2 and not {GHOST}.joining()",
        60,
        diagnose=lambda: repr(nvim.lua(f"return {GHOST}.shown()")),
    )
    after = nvim.lua(f"return {GHOST}.shown()")
    assert nvim.lua(f"return {GHOST}._debug().seq") > seq  # asked the server
    assert after["items"][0] == items[0][len(typed):]  # the one that was shown stays first
    assert len(set(after["items"])) == K
    assert buffer(nvim)[0] == FIRST_LINE + typed
