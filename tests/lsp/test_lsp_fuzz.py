"""A seeded, bounded fuzz of the real `kspec lsp`: thousands of messages of every
kind a sloppy or hostile client sends (deep nesting, broken framing, wrong types, lone
surrogates, edits outside documents, cancels, unknown methods, oversized messages,
responses reusing the ids of the client's own requests, model changes) mixed with valid
traffic. The server must not exit, must answer every well-formed request, must
never answer "internal error" (-32603, a bug) or log a traceback, and must still complete
at the end, and its memory stays within 1.5 times its peak with one engine."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsp_harness import FAST
from raw_rpc import RawServer, encode, frame

SEED = int(os.environ.get("KSPEC_FUZZ_SEED", "15"))
MESSAGES = int(os.environ.get("KSPEC_FUZZ_MESSAGES", "3000"))  # the suite's size; a soak sets more
MESSAGE_LIMIT = 64 * 1024  # --max-message-bytes, so oversized messages are cheap
SETTINGS = {**FAST, "deadlineMs": 5000}
URIS = [f"file:///fuzz/doc{index}.py" for index in range(4)]
WORDS = ["def ", "f", "(x)", ":\n", "    ", "return ", "x", " + 1", "\r\n", "\r", "é", "😀", "\u0000", "\\ud800", "'", "[", "}", "\t"]


def _surrogates(body: bytes) -> bytes:
    """The text "\\ud800" of WORDS, as JSON's escape of a lone surrogate."""
    return body.replace(b"\\\\ud800", b"\\ud800")


class Fuzz:
    def __init__(self, rng: random.Random, models: list[str]):
        self.rng = rng
        self.models = models  # settings flip between them: a storm of model changes
        self.next_id = 0
        self.expected: list[int] = []  # ids of well-formed requests: each must be answered
        self.sent: list[int] = []

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def text(self) -> str:
        return "".join(self.rng.choice(WORDS) for _ in range(self.rng.randrange(0, 30)))

    def position(self) -> Any:
        rng = self.rng
        good = {"line": rng.randrange(0, 6), "character": rng.randrange(0, 40)}
        if rng.random() < 0.6:
            return good
        bad_values = [1.5, "3", True, None, -1, 2**31, 2**40, [], {}, "😀"]
        key = rng.choice(["line", "character"])
        broken = {**good, key: rng.choice(bad_values)}
        if rng.random() < 0.2:
            del broken[key]
        return broken

    def request(self, method: str, params: Any) -> bytes:
        msg_id = self.new_id()
        self.expected.append(msg_id)
        self.sent.append(msg_id)
        return frame(_surrogates(encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})))

    def notification(self, method: str, params: Any) -> bytes:
        return frame(_surrogates(encode({"jsonrpc": "2.0", "method": method, "params": params})))

    # --- the kinds of message ---------------------------------------------------------------

    def stats(self) -> bytes:
        return self.request("kspec/stats", None)

    def inline(self) -> bytes:
        context: Any = {"triggerKind": self.rng.choice([0, 1, 2, 1, 2, 7, "x"])}
        if self.rng.random() < 0.1:
            context = self.rng.choice([None, [], "auto"])
        uri = self.rng.choice(URIS + ["file:///fuzz/never.py"])
        return self.request("textDocument/inlineCompletion", {"textDocument": {"uri": uri}, "position": self.position(), "context": context})

    def completion(self) -> bytes:
        return self.request("textDocument/completion", {"textDocument": {"uri": self.rng.choice(URIS)}, "position": self.position()})

    def open(self) -> bytes:
        version: Any = self.rng.choice([1, 2, 3, -1, "1", 1.5])
        item = {"uri": self.rng.choice(URIS), "languageId": self.rng.choice(["python", "rust", "", "\\ud800"]), "version": version, "text": self.text()}
        return self.notification("textDocument/didOpen", {"textDocument": item})

    def change(self) -> bytes:
        start, end = self.position(), self.position()
        changes: list[Any] = [{"range": {"start": start, "end": end}, "text": self.text()}]
        if self.rng.random() < 0.2:
            changes.append({"text": self.text()})
        if self.rng.random() < 0.05:
            changes = [{"range": "nope", "text": 3}]
        uri = self.rng.choice(URIS + ["file:///fuzz/never.py"])
        return self.notification("textDocument/didChange", {"textDocument": {"uri": uri, "version": self.rng.randrange(100)}, "contentChanges": changes})

    def close(self) -> bytes:
        return self.notification("textDocument/didClose", {"textDocument": {"uri": self.rng.choice(URIS)}})

    def cancel(self) -> bytes:
        target = self.rng.choice(self.sent) if self.sent and self.rng.random() < 0.8 else self.rng.choice(["x", 10**9, None])
        return self.notification("$/cancelRequest", {"id": target})

    def configure(self) -> bytes:
        keys: dict[str, Any] = {"k": [1, 2, 0, 99, "3"], "maxTokens": [2, 4], "debounceMs": [0, 5, "x"], "temperature": [0, 0.5, "hot"], "typeahead": [True, False, 1], "colour": ["blue"]}
        settings = {key: self.rng.choice(values) for key, values in keys.items() if self.rng.random() < 0.4}
        if self.rng.random() < 0.5:
            settings["model"] = self.rng.choice(self.models)
        return self.notification("workspace/didChangeConfiguration", {"settings": {"kspec": settings} if self.rng.random() < 0.8 else self.rng.choice([None, [], "x"])})

    def response(self) -> bytes:
        """A "response" from the client, often with the id of its own request in flight."""
        msg_id = self.rng.choice(self.sent) if self.sent and self.rng.random() < 0.8 else "never-sent"
        return frame(encode({"jsonrpc": "2.0", "id": msg_id, "result": None}))

    def unknown(self) -> bytes:
        return self.request(self.rng.choice(["kspec/nothing", "textDocument/hover", "workspace/symbol"]), {})

    def malformed(self) -> bytes:
        body = encode({"jsonrpc": "2.0", "id": self.new_id(), "method": "kspec/stats"})
        return frame(body[: self.rng.randrange(1, len(body))])

    def deep(self) -> bytes:
        depth = self.rng.choice([70, 1000, 100_000])
        nested = b"[" * depth + b"]" * self.rng.choice([0, depth])
        if self.rng.random() < 0.5:
            return frame(nested)
        msg_id = self.new_id()  # a request whose params nest too deep: a Parse error under its id
        self.expected.append(msg_id)
        return frame(b'{"jsonrpc": "2.0", "id": %d, "method": "kspec/stats", "params": %s}' % (msg_id, nested))

    def shapes(self) -> bytes:
        bodies = [b"[1, 2]", b"null", b'"text"', b"{}", b'{"jsonrpc": "2.0", "method": 42}', b'{"jsonrpc": "2.0", "id": true, "method": "kspec/stats"}',
                  b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "kspec/stats"}', b'{"jsonrpc": "2.0", "id": 1.5, "method": "kspec/stats"}',
                  b'{"jsonrpc": "1.0", "method": "initialized"}', b'{"jsonrpc": "2.0", "result": 1}', b'{"jsonrpc": "2.0", "id": "zz", "result": 1}']  # fmt: skip
        return frame(self.rng.choice(bodies))

    def binary(self) -> bytes:
        return frame(bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200))))

    def framing(self) -> bytes:
        body = encode({"jsonrpc": "2.0", "id": self.new_id(), "method": "kspec/stats"})
        return self.rng.choice(
            [
                frame(body, len(body) - self.rng.randrange(1, 5)),
                frame(body, len(body) + self.rng.randrange(1, 60)),
                b"Content-Length: -5\r\n\r\n" + body,
                b"Content-Length: twelve\r\n\r\n" + body,
                frame(body, 10**12),
                b"unframed bytes without a newline",
                b"x" * self.rng.randrange(1, 20_000),
            ]
        )

    def oversized(self) -> bytes:
        return self.request("kspec/stats", {"padding": "y" * (MESSAGE_LIMIT + 10)})

    def kinds(self) -> list[tuple[Callable[[], bytes], int]]:
        return [
            (self.stats, 10), (self.inline, 8), (self.completion, 3), (self.open, 6), (self.change, 12), (self.close, 3),
            (self.cancel, 3), (self.configure, 2), (self.unknown, 3), (self.malformed, 4), (self.deep, 2), (self.shapes, 4),
            (self.binary, 2), (self.framing, 4), (self.oversized, 1), (self.response, 2),
        ]  # fmt: skip


def _peak_kb(pid: int) -> int:
    """VmHWM: the most memory the process has held so far."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1])


async def test_fuzzed_messages_never_kill_silence_or_break_the_server(model_dir: Path, tmp_path: Path) -> None:
    server = await RawServer.start(tmp_path / "stderr.log", "--engine", "inprocess", "--max-message-bytes", str(MESSAGE_LIMIT))
    try:
        from model_factory import write_random_model

        await server.initialize({"model": str(model_dir), **SETTINGS})
        await server.wait_ready()
        idle_peak = _peak_kb(server.process.pid)  # the server with one engine, after its load
        models = [str(model_dir), str(write_random_model(tmp_path / "other", "llama", seed=1))]
        fuzz = Fuzz(random.Random(SEED), models)
        makers, weights = zip(*fuzz.kinds())
        for index in range(MESSAGES):
            server.write_bytes(fuzz.rng.choices(makers, weights)[0]())
            if index % 50 == 0:
                await server.drain()
        last = fuzz.stats()  # every broken frame before it is behind a header by now
        server.write_bytes(last)
        for msg_id in fuzz.expected:
            await server.answer(msg_id, timeout=120)
        assert server.process.returncode is None
        internal = [a for a in server.answers.values() if a.get("error", {}).get("code") == -32603]
        assert not internal, internal[:3]
        peak = _peak_kb(server.process.pid)
        assert peak <= 1.5 * idle_peak, f"peak {peak / 1024:.0f} MB, {idle_peak / 1024:.0f} MB with one engine (replaced engines still loaded?)"

        # Still useful: reset the settings, open a document, get a completion.
        server.notify("workspace/didChangeConfiguration", {"settings": {"kspec": SETTINGS}})
        uri = "file:///fuzz/final.py"
        server.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "def f(x):\n    return "}})
        params = {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 11}, "context": {"triggerKind": 1}}
        answer = await server.request("final", "textDocument/inlineCompletion", params)
        assert answer["result"]["items"], answer
        assert await server.close() == 0
        log = server.stderr()
        assert "Traceback" not in log, log[log.index("Traceback") - 200 : log.index("Traceback") + 3000]
    finally:
        if server.process.returncode is None:
            server.process.kill()
            await server.process.wait()
