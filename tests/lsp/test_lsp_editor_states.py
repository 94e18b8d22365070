"""What an editor shows between "ready" and a suggestion, against the real `kspec lsp`:

- the body after a line that opens a block, and the rest of a signature being written,
  instead of an empty answer (an OpenAI-compatible fake engine gives the model's text:
  the stop rule, trimming and the syntax checks are the server's own);
- `activity` in `$/kspec/status`: "busy" while any engine work for a document runs (also the
  decoding after an early answer; `decoding` lists the documents), then the answer's latency, or "timedOut" when nothing came by the deadline; the server's pid and
  the engine daemon's log file;
- a daemon `kspec lsp` started exits soon after its last client disconnected.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lsp_harness import FAST, editor_session
from loopback_http import JsonHandler, LoopbackServer

from kspec.lsp_server.engine_client import DAEMON_IDLE_TIMEOUT_S


class ScriptedEngine(LoopbackServer):
    """An OpenAI-compatible /v1 on loopback whose completions are the texts given for the
    end of the prompt they continue (what a code model writes there)."""

    def __init__(self, texts: dict[str, list[str]], stall_first: threading.Event | None = None) -> None:
        self.texts = texts
        self.posts = 0
        engine, count = self, threading.Lock()

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                self.answer_json({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:
                body = self.read_json()
                with count:
                    engine.posts += 1
                    first = engine.posts == 1
                if first and stall_first is not None:  # a first question slower than any deadline (a cold prompt)
                    stall_first.wait(60)
                prompt = str(body.get("prompt", ""))
                texts = next((texts for end, texts in engine.texts.items() if end in prompt), [])
                choices = [{"index": i, "text": text, "finish_reason": "stop"} for i, text in enumerate(texts[: body.get("n", 1)])]
                self.answer_json({"id": "cmpl-1", "object": "text_completion", "model": "scripted", "choices": choices})

        super().__init__(Handler)


HEADER_FILE = "def average_price(items):\n    total = 0\n    for item in items:\n    return total / len(items)\n"
DEF_FILE = "import math\n\n\ndef average_price(items):\n"
SIGNATURE_FILE = "class Cart:\n    def total(self\n\n    def count(self):\n        return 0\n"
SCRIPT = {
    "    for item in items:": ["\n        total += item.price\n    return total / len(items)\n"],
    "def average_price(items):": ["\n    return sum(item.price for item in items) / len(items)\n\n\nprint(average_price([]))\n"],
    "    def total(self": [", items):\n        return sum(items)\n\n    def count(self):\n"],
}


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    engine = ScriptedEngine(SCRIPT)
    yield engine
    engine.close()


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        (HEADER_FILE, 2, "\n        total += item.price"),  # end of `for item in items:`: the body
        (DEF_FILE, 3, "\n    return sum(item.price for item in items) / len(items)"),  # end of a def line
        (SIGNATURE_FILE, 1, ", items):\n        return sum(items)"),  # mid-signature: the rest of it and the body
    ],
    ids=["for-header", "def-header", "mid-signature"],
)
async def test_a_line_that_opens_a_block_gets_its_body(scripted: ScriptedEngine, text: str, line: int, expected: str) -> None:
    settings = {"engine": "openai", "engineUrl": scripted.url, "k": 1, "debounceMs": 0, "deadlineMs": 30000}
    async with editor_session(settings, args=()) as editor:
        await editor.ready()
        uri = "file:///work/cart.py"
        editor.open(uri, text)
        column = len(text.split("\n")[line])
        items = await editor.inline(uri, line, column)
        assert [item.insert_text for item in items] == [expected]
        assert items[0].range.start.line == line and items[0].range.start.character == column


async def test_busy_then_the_answer_and_who_answers(model_dir: Path) -> None:
    async with editor_session({"model": str(model_dir), **FAST}) as editor:
        await editor.ready()
        pid = editor.client._server.pid  # type: ignore[attr-defined]
        assert editor.statuses[-1]["serverPid"] == pid  # for :checkhealth kspec
        uri = "file:///work/busy.py"
        editor.open(uri, "def add(a, b):\n    return \n")
        seen = len(editor.statuses)
        assert await editor.inline(uri, 1, 11)
        assert editor.statuses[seen]["activity"] == "busy" and editor.statuses[seen]["decoding"] == [uri]
        # busy while the engine decodes on after an early answer; idle once nothing decodes
        idle = await editor.wait_status(lambda s: s["activity"] == "idle", timeout=60, after=seen)
        assert idle["decoding"] == [] and idle["state"] == "ready" and idle["latencyMs"] > 0
        assert "logFile" not in idle  # an engine inside kspec lsp logs to its stderr


async def test_no_answer_by_the_deadline_says_timed_out(tmp_path: Path) -> None:
    """A network engine that accepts the connection and never answers."""
    token = tmp_path / "token"
    token.write_text("secret\n")
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        settings = {"engine": "remote", "engineUrl": url, "engineTokenFile": str(token), "k": 1, "debounceMs": 0, "deadlineMs": 200}
        async with editor_session(settings, args=()) as editor:
            uri = "file:///work/late.py"
            editor.open(uri, "x = ")
            seen = len(editor.statuses)
            assert await editor.inline(uri, 0, 4) == []
            status = await editor.wait_status(lambda s: s.get("activity") == "timedOut", timeout=30, after=seen)
            assert [s["activity"] for s in editor.statuses[seen:]][:1] == ["busy"]
            assert status["serverPid"] > 0
            assert (await editor.stats())["timeouts"] == 1


async def test_a_request_that_timed_out_is_asked_again_and_the_client_told() -> None:
    """The first question at a file may outlast the deadline (the engine reads the whole prompt);
    asked once more it is answered in time. A client that re-asks on $/kspec/suggestionsUpdated
    is told, and its next ask gets the answer from the typeahead cache."""
    stall = threading.Event()
    engine = ScriptedEngine(SCRIPT, stall_first=stall)
    settings = {"engine": "openai", "engineUrl": engine.url, "k": 1, "debounceMs": 0, "deadlineMs": 300}
    try:
        async with editor_session(settings, args=()) as editor:
            await editor.ready()
            uri = "file:///work/cart.py"
            editor.open(uri, DEF_FILE)
            end = len("def average_price(items):")
            assert await editor.inline(uri, 3, end) == []  # the stalled first question: nothing by the deadline
            stall.set()  # the engine gets through the slow question; the one asked again follows it
            update = await editor.wait_update(uri, timeout=30)
            assert update["version"] == 1
            items = await editor.inline(uri, 3, end)
            stats = await editor.stats()
            assert [item.insert_text for item in items] == ["\n    return sum(item.price for item in items) / len(items)"]
            assert (stats["timeouts"], stats["retried"], stats["typeahead_hits"], engine.posts) == (1, 1, 1, 2), stats
    finally:
        stall.set()
        engine.close()


def wait_exit(pid: int, timeout: float) -> float | None:
    """Seconds until process `pid` (not our child) exits, waited on a pidfd; None if it did not."""
    started = time.monotonic()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0.0
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return time.monotonic() - started if readable else None
    finally:
        os.close(fd)


def test_a_daemon_started_by_the_editor_goes_soon_after_it() -> None:
    assert DAEMON_IDLE_TIMEOUT_S <= 30  # seconds, not the 15 minutes it used to hold ~1.4 GB for


async def test_the_daemon_exits_soon_after_the_last_client_disconnects(model_dir: Path, runtime_dir: Path) -> None:
    idle_s = 1.0
    args = ("--engine", "daemon", "--engine-idle-timeout", str(idle_s))
    async with editor_session({"model": str(model_dir), **FAST}, args=args, runtime_dir=runtime_dir) as editor:
        ready = await editor.ready()
        pid = ready["enginePid"]
        log_file = Path(ready["logFile"])  # what :KspecLog / "kspec: Show log" open
        assert log_file.exists() and log_file.parent == runtime_dir / "kspec"
        rss = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
        print(f"daemon pid {pid} {rss.split(':')[1].strip()} with the test model")
    # the editor's session ended (shutdown, exit): the daemon's only client is gone
    took = wait_exit(pid, idle_s + 30)
    assert took is not None, "the daemon is still running"
    print(f"daemon exited {took:.2f} s after its last client disconnected (idle timeout {idle_s} s)")
    assert took < idle_s + 10
