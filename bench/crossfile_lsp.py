"""The cross-file bench's editor: `kspec lsp` over stdio, driven as an editor drives it (see
bench/crossfile.py for what is measured)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.io_ import run_async
from pygls.lsp.client import LanguageClient

from kspec.bench.crossfile import WAYS, CrossFileConfig, Cut, Tally, find_cuts, package_folders

STATUS = "$/kspec/status"


class Editor:
    """One `kspec lsp` process and its client; `status` is the last `$/kspec/status`. The process
    is started here, not by the client's `start_io` (pygls has no public handle on the process it
    starts): its stderr is read, it is killed if it outlives `exit`, and a request fails at once
    when it ends."""

    def __init__(self) -> None:
        self.client = LanguageClient("kspec-crossfile-bench", "0")
        self.status: dict[str, Any] = {}
        self._ready = asyncio.Event()
        self.client.feature(STATUS)(lambda params: self._on_status(params))
        self.client.feature(lsp.WINDOW_SHOW_MESSAGE)(lambda params: None)
        self.stderr_tail: list[str] = []
        self._version: dict[str, int] = {}
        self.process: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Future | None = None  # the process's end
        self._stop_reading = threading.Event()
        self._reading: asyncio.Future | None = None  # the client's loop over the server's messages

    def _on_status(self, params: Any) -> None:
        self.status = _plain(params)
        if self.status.get("state") == "ready":
            self._ready.set()

    async def start(self, folder: Path, options: dict[str, Any], timeout_s: float) -> None:
        env = {**os.environ, "KSPEC_LOG_LEVEL": "warning"}
        pipe = asyncio.subprocess.PIPE
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kspec.cli.main", "lsp", "--engine", "inprocess", env=env, stdin=pipe, stdout=pipe, stderr=pipe,
        )  # fmt: skip
        self._exited = asyncio.ensure_future(self.process.wait())
        self.client.protocol.set_writer(self.process.stdin)
        self._reading = asyncio.ensure_future(run_async(stop_event=self._stop_reading, reader=self.process.stdout, protocol=self.client.protocol))
        asyncio.ensure_future(self._drain(self.process.stderr))
        params = lsp.InitializeParams(
            capabilities=lsp.ClientCapabilities(), initialization_options=options, root_uri=folder.as_uri(),
            workspace_folders=[lsp.WorkspaceFolder(uri=folder.as_uri(), name=folder.name)],
        )  # fmt: skip
        await self._answer(self.client.initialize_async(params), timeout_s)
        self.client.initialized(lsp.InitializedParams())
        await asyncio.wait_for(self._ready.wait(), timeout_s)

    async def _drain(self, stream: asyncio.StreamReader | None) -> None:
        while stream is not None and (line := await stream.readline()):
            self.stderr_tail = [*self.stderr_tail[-20:], line.decode("utf-8", "replace")]

    async def _answer(self, request: Awaitable[Any], timeout_s: float) -> Any:
        """The answer to `request`; an error at once if the server process ends first."""
        assert self._exited is not None and self.process is not None
        answer = asyncio.ensure_future(request)
        done, _ = await asyncio.wait({answer, self._exited}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if answer in done:
            return answer.result()
        answer.cancel()
        if self._exited in done:
            raise RuntimeError(f"kspec lsp exited with code {self.process.returncode}")
        raise asyncio.TimeoutError()

    def configure(self, settings: dict[str, Any]) -> None:
        self.client.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings={"kspec": settings}))

    def open(self, uri: str, text: str) -> None:
        self._version[uri] = 1
        self.client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def close(self, uri: str) -> None:
        self.client.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri)))

    def type(self, uri: str, line: int, column: int, text: str) -> None:
        self._version[uri] += 1
        at = lsp.Position(line, column)
        change = lsp.TextDocumentContentChangePartial(range=lsp.Range(at, at), text=text)
        self.client.text_document_did_change(lsp.DidChangeTextDocumentParams(lsp.VersionedTextDocumentIdentifier(version=self._version[uri], uri=uri), [change]))

    async def inline(self, uri: str, line: int, column: int, timeout_s: float) -> tuple[list[str], float]:
        params = lsp.InlineCompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri), position=lsp.Position(line, column),
            context=lsp.InlineCompletionContext(trigger_kind=lsp.InlineCompletionTriggerKind.Invoked),
        )  # fmt: skip
        started = time.perf_counter()
        result = await self._answer(self.client.text_document_inline_completion_async(params), timeout_s)
        elapsed = (time.perf_counter() - started) * 1000
        items = result.items if isinstance(result, lsp.InlineCompletionList) else (result or [])
        return [item.insert_text if isinstance(item.insert_text, str) else item.insert_text.value for item in items], elapsed

    async def stop(self) -> None:
        try:
            await self._answer(self.client.shutdown_async(None), 30)
            self.client.exit(None)
        except Exception:  # the process may be gone already
            pass
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
        self._stop_reading.set()
        if self._reading is not None:
            await asyncio.gather(self._reading, return_exceptions=True)  # its stdout ended with the process


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return {key: _plain(item) for key, item in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _holed(text: str, cut: Cut) -> str:
    """The file with the rest of the hole's line (the reference) removed."""
    lines = text.splitlines(keepends=True)
    row = lines[cut.line]
    lines[cut.line] = row[: cut.column] + ("\n" if row.endswith("\n") else "")
    return "".join(lines)


async def ask(editor: Editor, folder: Path, cut: Cut, way: str, timeout_s: float, tally: Tally) -> None:
    uri = (folder / cut.module).as_uri()
    sibling = (folder / cut.sibling).as_uri()
    editor.configure({"contextFiles": way != "off"})
    if way == "open":
        editor.open(sibling, (folder / cut.sibling).read_text(encoding="utf-8"))
    editor.open(uri, _holed((folder / cut.module).read_text(encoding="utf-8"), cut))
    texts, cold_ms = await editor.inline(uri, cut.line, cut.column, timeout_s)
    context = dict(editor.status.get("context") or {})
    editor.type(uri, cut.line, cut.column, cut.reference[:1])
    _, warm_ms = await editor.inline(uri, cut.line, cut.column + 1, timeout_s)
    warm_prompt = dict(editor.status.get("prompt") or {})
    editor.close(uri)
    if way == "open":
        editor.close(sibling)
    tally.add(cut, texts, cold_ms, warm_ms, context, warm_prompt)


def scratch_workspace(cuts: list[Cut], packages: list[tuple[str, Path]]) -> Path:
    """A temporary workspace folder holding a copy of each package the cuts come from."""
    folder = Path(tempfile.mkdtemp(prefix="kspec-crossfile-"))
    for name, source in packages:
        if any(cut.package == name for cut in cuts):
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test*"))
    return folder


async def _run(config: CrossFileConfig, cuts: list[Cut], folder: Path, progress: Callable[[str], None]) -> tuple[dict[str, Tally], dict[str, Any]]:
    """Each way's tally, and the engine's machine defaults (what chose the context budget)."""
    options = {"k": config.k, "maxTokens": config.max_tokens, "debounceMs": 0, "deadlineMs": config.deadline_ms,
               "firstAnswerMs": 0, "typeahead": False, **({"model": config.model} if config.model else {}),
               **({"promptTokens": config.prompt_tokens} if config.prompt_tokens else {})}  # fmt: skip
    tallies = {way: Tally() for way in WAYS}
    editor = Editor()
    try:
        await editor.start(folder, options, config.start_timeout_s)
        timeout_s = config.deadline_ms / 1000 + 30
        for cut in cuts:
            for way in WAYS:  # A B C per cut: every way sees the same moments of machine noise
                await ask(editor, folder, cut, way, timeout_s, tallies[way])
            progress(f"{cut.package}:{cut.name}:{cut.kind}")
    except (asyncio.TimeoutError, ConnectionError) as exc:
        raise RuntimeError(f"kspec lsp stopped answering ({type(exc).__name__}); its last log lines: {''.join(editor.stderr_tail)[-2000:]}") from exc
    finally:
        await editor.stop()
    return tallies, dict(editor.status.get("defaults") or {})


def run_crossfile_bench(config: CrossFileConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    packages = package_folders(config.packages)
    if not packages:
        raise RuntimeError(f"none of the packages {', '.join(config.packages)} is installed here as a package folder")
    cuts = find_cuts(packages, config.holes, random.Random(config.seed))
    folder = scratch_workspace(cuts, packages)
    try:
        tallies, defaults = asyncio.run(_run(config, cuts, folder, progress))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report: dict[str, Any] = {"config": {"holes": len(cuts) // 2, "cuts": len(cuts), "k": config.k, "max_tokens": config.max_tokens,
                                         "seed": config.seed, "packages": sorted({c.package for c in cuts})}}  # fmt: skip
    report["machine_defaults"] = defaults
    for kind in ("all", "line", "name"):
        report[kind] = {way: _subset(tallies[way], cuts, kind).summary() for way in WAYS}
    report["cases"] = [
        {"package": c.package, "module": str(c.module), "sibling": str(c.sibling), "name": c.name, "kind": c.kind, "line": c.line, "column": c.column,
         "reference": c.reference, **{way: tallies[way].shown[at] for way in WAYS},
         # per way, cold and warm latency (ms): p95 pooled over several runs
         "ms": {way: [round(tallies[way].cold_ms[at], 1), round(tallies[way].warm_ms[at], 1)] for way in WAYS}}
        for at, c in enumerate(cuts)
    ]  # fmt: skip
    off, opened = report["all"]["off"], report["all"]["open"]
    if off["warm_p95_ms"] and opened["warm_p95_ms"]:
        report["warm_p95_open_over_off"] = round(opened["warm_p95_ms"] / off["warm_p95_ms"], 3)
    return report


def _subset(tally: Tally, cuts: list[Cut], kind: str) -> Tally:
    """The tally's cuts of one kind ("all": every cut), recomputed from its per-cut lists."""
    if kind == "all":
        return tally
    part = Tally()
    for at, cut in enumerate(cuts):
        if cut.kind == kind:
            part.count(tally.flags[at], tally.cold_ms[at], tally.warm_ms[at])
            part.context_tokens.append(tally.context_tokens[at])
            part.context_files.append(tally.context_files[at])
            part.warm_prefill_ms.append(tally.warm_prefill_ms[at])
            part.warm_uncached.append(tally.warm_uncached[at])
    return part
