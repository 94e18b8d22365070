"""llama.cpp's `/infill` as a completion engine for the quality benches: the answer llama.vim and
llama.vscode show for a cursor, on the same GGUF file and the same window as kspec.

The request is llama.vim's: the window's lines before the cursor's line as `input_prefix`, the
cursor's line up to the cursor as `prompt`, the rest as `input_suffix`, `n_indent` the cursor
line's indentation (the server stops at a line indented less), `n_predict` the bench's token
budget, and `t_max_predict_ms` the request's deadline: llama.vim's time cap, the server's own way
of answering with what it has by then, as kspec's deadline is kspec's (the server's cap counts
from its first generated token, so its answer comes that token's time later; the executed
bench's latency columns show it). Greedy (temperature 0): one answer, the model's most likely
text, which is what kspec's top suggestion is compared with. After `clear_caches` the next request
does not reuse the server's prompt cache (a cold prompt).
llama-server runs with one slot and the bench's threads.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kspec.bench.peer import PeerServer
from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.engine.serve.network import free_port

PEER_CONTEXT = 8192  # llama-server's context: the windows (6000 + 2000 characters) fit whole
PEER_NAME = "llama.cpp /infill (greedy)"


def infill_body(prefix: str, suffix: str, max_tokens: int, deadline_ms: float | None = None, reuse_cache: bool = True) -> dict[str, Any]:
    """llama.vim's request for a cursor between `prefix` and `suffix`."""
    line_start = prefix.rfind("\n") + 1
    line = prefix[line_start:]
    return {
        "input_prefix": prefix[:line_start], "prompt": line, "input_suffix": suffix, "input_extra": [],
        "n_indent": len(line) - len(line.lstrip(" \t")), "n_predict": max_tokens, "temperature": 0,
        "cache_prompt": reuse_cache, "stream": False, **({"t_max_predict_ms": int(deadline_ms)} if deadline_ms else {}),
    }  # fmt: skip


class InfillPeer:
    """A running llama-server answering `complete` through `/infill` (a context manager)."""

    model_name = PEER_NAME

    def __init__(self, llama_server: Path, gguf: Path, threads: int, start_timeout_s: float = 300.0) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="kspec-infill-peer-")
        log = Path(self._folder.name) / "llama-server.log"
        port = free_port("127.0.0.1")
        command = [
            str(llama_server), "-m", str(gguf), "-t", str(threads), "-np", "1", "-c", str(PEER_CONTEXT),
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        with open(log, "wb") as sink:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
        self._server = PeerServer("llama-server", process, port, None, log, time.monotonic())
        self._cold = False
        try:
            asyncio.run(self._server.wait_ready(start_timeout_s))
        except BaseException:
            self.close()
            raise

    def clear_caches(self) -> None:
        self._cold = True

    def complete(self, request: CompletionRequest) -> CompletionResult:
        body = infill_body(request.prefix, request.suffix, request.max_tokens, request.deadline_ms, reuse_cache=not self._cold)
        self._cold = False
        started = time.perf_counter()
        status, answer = asyncio.run(self._server.call("POST", "/infill", body, timeout_s=max(request.deadline_ms / 1000, 1.0) + 300))
        if status != 200 or not isinstance(answer, dict):
            raise RuntimeError(f"llama-server /infill answered {status}: {str(answer)[:300]}")
        text = str(answer.get("content", "")).rstrip()
        elapsed = (time.perf_counter() - started) * 1000
        timing = {"total": elapsed, "prompt_tokens": float((answer.get("timings") or {}).get("prompt_n", 0))}
        finish = "stop" if answer.get("stop_type") in ("eos", "word") else "length"
        completions = [Completion(text, 0.0, 0.0, int(answer.get("tokens_predicted", 0)), finish)] if text.strip() else []
        return CompletionResult(completions, PEER_NAME, timing)

    def close(self) -> None:
        self._server.stop()
        self._folder.cleanup()

    def __enter__(self) -> "InfillPeer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
