"""End-to-end helpers (imported by the tests as `lsp_harness`): the real `kspec lsp` process driven by pytest-lsp's client.

`Editor` wraps the client with what the tests need: documents, inline requests,
`$/kspec/status` notifications awaited with deadlines (no sleeps), raw frames for
malformed input, and the server's `kspec/stats`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from kspec.lsp_server.client_kind import DECLARES_UPDATES
from suite_models import real_default_env

REPO = Path(__file__).resolve().parents[2]
# Random weights make garbage that trimming and the syntax checks rightly drop: "raw"
# keeps it, so every request has suggestions to check (tests/lsp/test_lsp_default_model.py
# covers the whole pipeline).
FAST = {"k": 2, "maxTokens": 4, "debounceMs": 0, "deadlineMs": 30000, "raw": True}
START_TIMEOUT_S = 90.0


def plain(value: Any) -> Any:
    """pygls hands untyped JSON objects over as namedtuples; back to dicts and lists."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


class Editor:
    def __init__(self, client: LanguageClient):
        self.client = client
        self.statuses: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()
        client.feature("$/kspec/status")(lambda params: self._on_status(params))
        self.updates: list[dict[str, Any]] = []  # $/kspec/suggestionsUpdated
        client.feature("$/kspec/suggestionsUpdated")(lambda params: self._on_update(params))
        self._versions: dict[str, int] = {}
        self._hand_written: dict[Any, asyncio.Future] = {}  # ids of requests written by hand (`raw_request`) -> their answers
        self._handle_message = client.protocol.handle_message
        client.protocol.handle_message = self._on_message  # type: ignore[method-assign]

    def _on_message(self, message: Any) -> None:
        """Every message from the server, through pygls' public entry point for them: the answer to
        a request written by hand goes to its waiter (pygls would drop it as the answer to an id
        it never sent), the rest to pygls."""
        waiting = None if hasattr(message, "method") else self._hand_written.pop(getattr(message, "id", None), None)
        if waiting is None:
            self._handle_message(message)
        elif getattr(message, "error", None) is not None:
            waiting.set_exception(JsonRpcException.from_error(message.error))
        else:
            waiting.set_result(message.result)

    def _on_status(self, params: Any) -> None:
        self.statuses.append(plain(params))
        self._arrived.set()

    def _on_update(self, params: Any) -> None:
        self.updates.append(plain(params))
        self._arrived.set()

    async def wait_update(self, uri: str, timeout: float = 60.0) -> dict[str, Any]:
        """The first `$/kspec/suggestionsUpdated` for `uri`, waiting up to `timeout` (no sleeps)."""
        return await self._wait_for(self.updates, lambda update: update["uri"] == uri, timeout, f"suggestionsUpdated for {uri}")

    async def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = START_TIMEOUT_S, after: int = 0) -> dict[str, Any]:
        """The first status (from index `after`) that satisfies `predicate`, waiting up to `timeout`."""
        return await self._wait_for(self.statuses, predicate, timeout, "matching status", after)

    async def _wait_for(
        self, arrived: list[dict[str, Any]], predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str, after: int = 0
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for message in arrived[after:]:
                if predicate(message):
                    return message
            self._arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout} s; got {arrived[after:]}")
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def ready(self) -> dict[str, Any]:
        return await self.wait_status(lambda s: s["state"] == "ready")

    def open(self, uri: str, text: str, language: str = "python") -> None:
        self._versions[uri] = 1
        self.client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))

    def close(self, uri: str) -> None:
        self._versions.pop(uri, None)
        self.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri=uri)))

    def edit(self, uri: str, start: tuple[int, int], end: tuple[int, int], text: str) -> None:
        self._versions[uri] += 1
        change = lsp.TextDocumentContentChangePartial(range=lsp.Range(lsp.Position(*start), lsp.Position(*end)), text=text)
        self.client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(lsp.VersionedTextDocumentIdentifier(uri=uri, version=self._versions[uri]), [change])
        )

    def inline_params(self, uri: str, line: int, character: int, automatic: bool = False) -> lsp.InlineCompletionParams:
        kind = lsp.InlineCompletionTriggerKind.Automatic if automatic else lsp.InlineCompletionTriggerKind.Invoked
        return lsp.InlineCompletionParams(
            context=lsp.InlineCompletionContext(trigger_kind=kind),
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=lsp.Position(line, character),
        )

    async def inline(self, uri: str, line: int, character: int, automatic: bool = False, timeout: float = 60.0) -> list[lsp.InlineCompletionItem]:
        result = await asyncio.wait_for(self.client.text_document_inline_completion_async(self.inline_params(uri, line, character, automatic)), timeout)
        assert isinstance(result, lsp.InlineCompletionList)
        return list(result.items)

    async def stats(self) -> dict[str, Any]:
        result = await asyncio.wait_for(self.client.protocol.send_request_async("kspec/stats", None), 10)
        return plain(result)

    async def settled(self, timeout: float = 60.0) -> dict[str, Any]:
        """The stats once no engine work goes on after its answer or cancellation (a closed
        document's, a superseded request's): its counters are final then."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (stats := await self.stats())["work_on"]:
            assert asyncio.get_running_loop().time() < deadline, "engine work still going on"
        return stats

    def configure(self, settings: dict[str, Any]) -> None:
        self.client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"kspec": settings}))

    def send_raw(self, body: bytes) -> None:
        """A frame written as is (malformed input)."""
        self.client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)  # type: ignore[union-attr]

    async def raw_request(self, body: dict[str, Any] | bytes, msg_id: int, timeout: float = 30.0) -> Any:
        """Send a request by hand and wait for the response to `msg_id` (its error, if any, is raised)."""
        future = self._hand_written[msg_id] = asyncio.get_running_loop().create_future()
        self.send_raw(body if isinstance(body, bytes) else json.dumps(body).encode())
        return await asyncio.wait_for(future, timeout)

    def messages(self, contains: str = "") -> list[str]:
        return [m.message for m in self.client.messages if contains in m.message]

    async def wait_message(self, contains: str, timeout: float = 10.0) -> list[str]:
        """window/showMessage texts containing `contains`, polling until one arrives (or fail)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.messages(contains):
            if loop.time() > deadline:
                raise AssertionError(f"no message containing {contains!r} within {timeout} s; got {self.messages()}")
            await asyncio.sleep(0.01)  # a poll of the client's message list, not a wait for time to pass
        return self.messages(contains)


def server_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "kspec.cli.main", "lsp", *extra]


def server_env(runtime_dir: Path | None = None, real_default: bool = False) -> dict[str, str]:
    """The server's environment: the suite's small model as the default (tests/conftest.py), or with
    `real_default` the default a user gets."""
    env = {**(real_default_env() if real_default else os.environ), "PYTHONPATH": str(REPO)}
    if runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    return env


@asynccontextmanager
async def editor_session(
    options: dict[str, Any],
    *,
    client: str = "visual-studio-code",
    capabilities: lsp.ClientCapabilities | None = None,
    args: tuple[str, ...] = ("--engine", "inprocess"),
    runtime_dir: Path | None = None,
    updates: bool = True,
    folders: tuple[Path, ...] = (),
    real_default: bool = False,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Editor]:
    """`env`: variables set on top of the server's environment (the daemon it starts inherits them)."""
    config = ClientServerConfig(server_command=server_command(*args), server_env={**server_env(runtime_dir, real_default), **(env or {})})
    language_client = await config.start()
    editor = Editor(language_client)  # type: ignore[arg-type]
    try:
        declared = capabilities or client_capabilities(client)
        if updates:  # like our editors: it handles $/kspec/suggestionsUpdated (the Editor above does)
            declared.experimental = {**(declared.experimental or {}), **DECLARES_UPDATES}
        params = lsp.InitializeParams(capabilities=declared, initialization_options=options)
        if folders:  # the client's workspace folders (the context gatherer reads only inside them)
            params.workspace_folders = [lsp.WorkspaceFolder(uri=folder.as_uri(), name=folder.name) for folder in folders]
        editor.initialize_result = await asyncio.wait_for(language_client.initialize_session(params), START_TIMEOUT_S)  # type: ignore[attr-defined]
        yield editor
        if not language_client.stopped:  # a test may have ended the server itself
            await asyncio.wait_for(language_client.shutdown_session(), 30)
    finally:
        # pygls 2.1 and pytest-lsp have no public handle on the process `start_io` started
        if language_client._server is not None and language_client._server.returncode is None:
            language_client._server.kill()
        await language_client.stop()


def daemon_pids(folder: Path) -> list[int]:
    """Live `kspec engine` processes whose socket is in `folder` (checked, so a reused pid is never hit)."""
    pids = []
    for lock in (folder / "kspec").glob("*.lock"):
        text = lock.read_text().strip()
        if not text.isdigit():
            continue
        try:
            command = Path(f"/proc/{text}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine" in command and any(str(folder).encode() in part for part in command):
            pids.append(int(text))
    return pids


async def tcp_server(runtime: Path, *args: str) -> tuple[asyncio.subprocess.Process, str, int, str]:
    """`kspec lsp --tcp 0 ARGS`: the process, its address and the token it wrote."""
    process = await asyncio.create_subprocess_exec(*server_command("--tcp", "0", *args), stderr=asyncio.subprocess.PIPE, env=server_env(runtime))
    assert process.stderr is not None
    found: dict[str, str] = {}
    while "port" not in found:
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        assert line, "the server exited"
        if match := re.search(r"token in (\S+)", line):
            found["token"] = Path(match.group(1)).read_text()
        if match := re.search(r"listening on (127\.0\.0\.1):(\d+)", line):  # a bare port means loopback
            found["host"], found["port"] = match.group(1), match.group(2)
    return process, found["host"], int(found["port"]), found["token"]
