"""`kspec bench peer`: kspec's engine beside llama.cpp's llama-server on the same GGUF file.

Both run as the servers users would run, on this machine, with the same threads: kspec's
`kspec engine --listen` (its defaults, machine fit included) and `llama-server -m GGUF -t N
-np 4 -c 8192`. Both answer llama.cpp's `/completion` API, so each gets the same body: a
prompt (the text before a cursor in a real Python file) that the first, untimed request puts
in each server's prompt cache, then keystrokes, each a request for `n_cmpl` alternatives of
32 new tokens (temperature 0) over the prompt plus the characters typed so far. Requests
alternate between the servers and their order flips every keystroke; medians per n, and the
tokens each answer says it generated (tokens_predicted, summed over the alternatives) per
second of the whole request. Also measured side by side: the time from a server's start to its
first healthy answer (load), a cold prefill (a new ~1.5k-token window, the language server's
6000 characters, each server asked for one token; tokens/s of its reported prompt tokens), and
resident memory (VmRSS, and the peak VmHWM) of both processes at the end, and again after both
have been idle for `IDLE_TRIM_S` + `IDLE_SETTLE_S` (`resident_idle_mb`).

Each server treats the prompt its own way: kspec keeps the last tokens that fit its fitted
prompt budget (`$/kspec/status` promptTokens), llama.cpp evaluates all of it. That is part
of what is compared: the time a user waits for the same keystroke.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kspec.engine.config import EngineConfig, to_flags
from kspec.engine.freed_memory import IDLE_TRIM_S
from kspec.engine.serve.network import free_port, parse_engine_url
from kspec.lsp_server.http_client import HttpError, request_json

PROMPT_CHARS = 4400  # ~1.1k tokens of the demo model's tokenizer
COLD_CHARS = 6000  # a cold request's window: the language server's default characters before the cursor (~1.5k tokens)
COLD_REPEATS = 3  # cold windows per server, each a different part of the file
IDLE_SETTLE_S = 1.0  # past the engine's idle moment, before the idle memory is read
CURSOR_LINE = "    def _split(self, text):"  # the place in textwrap.py where "typing" happens
SLOTS, CONTEXT = 4, 16384  # llama-server: 4 parallel slots over a 16k context (its KV is allocated up front)


@dataclass(frozen=True)
class PeerBenchConfig:
    llama_server: Path
    gguf: Path
    threads: int
    ns: tuple[int, ...] = (1, 4)
    keystrokes: int = 5
    new_tokens: int = 32
    start_timeout_s: float = 300.0
    starts: int = 0  # then each server started this many times more, one at a time, alternating: spawn to healthy

    def __post_init__(self) -> None:
        if not self.llama_server.is_file() or not os.access(self.llama_server, os.X_OK):
            raise ValueError(f"{self.llama_server}: not an executable llama-server (build it: ../shared/tools/build-llama-cpp.sh)")
        if self.gguf.suffix.lower() != ".gguf" or not self.gguf.is_file():
            raise ValueError(f"{self.gguf}: the peer needs a .gguf file (--model)")
        if self.threads < 1 or self.keystrokes < 1 or not self.ns or min(self.ns) < 1:
            raise ValueError("threads, keystrokes and every n must be >= 1")
        if self.starts < 0:
            raise ValueError(f"starts must be >= 0, got {self.starts}")


def keystroke_prompts(count: int) -> tuple[str, list[str]]:
    """(the cached prompt, one prompt per keystroke: it plus one more typed character each)."""
    source = Path(textwrap.__file__).read_text(encoding="utf-8")
    point = source.index(CURSOR_LINE)
    prompt = source[:point][-PROMPT_CHARS:]
    typed = CURSOR_LINE.lstrip()
    return prompt, [prompt + "    " + typed[: 4 + i] for i in range(count)]


def cold_windows(count: int) -> list[str]:
    """`count` different windows of COLD_CHARS characters (json/decoder.py and textwrap.py): prompts
    no server has cached."""
    import json.decoder

    source = Path(json.decoder.__file__).read_text(encoding="utf-8") + Path(textwrap.__file__).read_text(encoding="utf-8")
    step = max(1, (len(source) - COLD_CHARS) // max(1, count))
    return [source[i * step : i * step + COLD_CHARS] for i in range(count)]


def completion_body(prompt: str, n: int, new_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "cache_prompt": True}
    if n > 1:
        body["n_cmpl"] = n
    return body


def resident_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of a process, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return {key: round(int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024, 1) for key in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


@dataclass
class PeerServer:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    token: str | None
    log: Path
    started: float  # time.monotonic() at spawn
    load_s: float = 0.0  # spawn -> first healthy answer

    async def call(self, method: str, path: str, body: Any = None, timeout_s: float = 600.0) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return await request_json(parse_engine_url(f"http://127.0.0.1:{self.port}"), method, path, body, headers, timeout_s=timeout_s)

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}); its log: {self.log}")
            try:
                status, _ = await self.call("GET", "/health", timeout_s=5)
                if status == 200:
                    self.load_s = time.monotonic() - self.started
                    return
            except (HttpError, asyncio.TimeoutError):  # not listening yet
                pass
            await asyncio.sleep(0.25)  # polling a process that is starting: there is no event to wait on
        raise RuntimeError(f"{self.name} was not ready within {timeout_s:.0f} s; its log: {self.log}")

    async def complete(self, body: dict[str, Any]) -> tuple[float, int, int]:
        """(milliseconds until the whole answer arrived, tokens generated over every alternative,
        prompt tokens the server evaluated for it)."""
        started = time.perf_counter()
        status, answer = await self.call("POST", "/completion", body)
        if status != 200:
            raise RuntimeError(f"{self.name} answered {status}: {str(answer)[:300]}")
        elapsed = (time.perf_counter() - started) * 1000
        answers = answer if isinstance(answer, list) else [answer]
        generated = sum(int(a.get("tokens_predicted", 0)) for a in answers)
        evaluated = int((answers[0].get("timings") or {}).get("prompt_n", 0)) if answers else 0
        return elapsed, generated, evaluated

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


ServerSpec = tuple[str, list[str], int, "str | None", Path]  # name, command, port, token, log


def _start(engine: EngineConfig, config: PeerBenchConfig, folder: Path) -> list[PeerServer]:
    return [_spawn(spec) for spec in _specs(engine, config, folder)]


def _spawn(spec: ServerSpec) -> PeerServer:
    name, command, port, token, log = spec
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
    return PeerServer(name, process, port, token, log, time.monotonic())


async def _start_times(specs: list[ServerSpec], config: PeerBenchConfig) -> dict[str, Any]:
    """Each server started `config.starts` times alone (the other stopped), alternating which goes
    first: seconds from spawn to its first healthy answer; the conversion caches are warm by now."""
    times: dict[str, list[float]] = {spec[0]: [] for spec in specs}
    for index in range(config.starts):
        for spec in specs if index % 2 == 0 else specs[::-1]:
            server = _spawn(spec)
            try:
                await server.wait_ready(config.start_timeout_s)
                times[spec[0]].append(round(server.load_s, 2))
            finally:
                server.stop()
    medians = {name: round(statistics.median(values), 2) for name, values in times.items()}
    kspec, llama = specs[0][0], specs[1][0]
    return {"s": times, "median_s": medians, "kspec_over_llama": round(medians[kspec] / medians[llama], 2)}


def _specs(engine: EngineConfig, config: PeerBenchConfig, folder: Path) -> list[ServerSpec]:
    token = secrets.token_hex(16)
    token_file = folder / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    kspec_port, llama_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    kspec_log, llama_log = folder / "kspec.log", folder / "llama-server.log"
    kspec_command = [
        sys.executable, "-m", "kspec.cli.main", "engine", "--listen", f"127.0.0.1:{kspec_port}", "--token-file", str(token_file),
        *to_flags(engine),
    ]  # fmt: skip
    llama_command = [
        str(config.llama_server), "-m", str(config.gguf), "-t", str(config.threads), "-np", str(SLOTS), "-c", str(CONTEXT),
        "--host", "127.0.0.1", "--port", str(llama_port),
    ]  # fmt: skip
    return [("kspec engine", kspec_command, kspec_port, token, kspec_log), ("llama-server", llama_command, llama_port, None, llama_log)]


async def _measure(servers: list[PeerServer], config: PeerBenchConfig) -> dict[str, Any]:
    await asyncio.gather(*(server.wait_ready(config.start_timeout_s) for server in servers))  # started together
    report: dict[str, Any] = {"load_s": {server.name: round(server.load_s, 2) for server in servers}}
    report["cold_prefill"] = await _cold_prefill(servers)
    prompt, keystrokes = keystroke_prompts(config.keystrokes)
    for server in servers:  # untimed: puts the prompt in each server's cache
        await server.complete(completion_body(prompt, 1, config.new_tokens))
    for n in config.ns:
        times: dict[str, list[float]] = {server.name: [] for server in servers}
        rates: dict[str, list[float]] = {server.name: [] for server in servers}
        for index, text in enumerate(keystrokes):
            order = servers if index % 2 == 0 else servers[::-1]
            for server in order:
                ms, generated, _ = await server.complete(completion_body(text, n, config.new_tokens))
                times[server.name].append(ms)
                rates[server.name].append(1000 * generated / ms)
        medians = {name: round(statistics.median(values), 1) for name, values in times.items()}
        tok_s = {name: round(statistics.median(values), 1) for name, values in rates.items()}
        kspec, llama = servers[0].name, servers[1].name
        report[f"n={n}"] = {
            "ms": medians, "tok_s": tok_s, "kspec_speedup": round(medians[llama] / medians[kspec], 2),
            "kspec_tok_s_ratio": round(tok_s[kspec] / tok_s[llama], 2), "all_ms": times,
        }  # fmt: skip
    rss = {server.name: resident_mb(server.process.pid) for server in servers}
    report["resident_mb"] = rss
    report["kspec_rss_over_llama"] = round(rss[servers[0].name]["VmRSS"] / rss[servers[1].name]["VmRSS"], 2)
    # ... and once both have been idle as long as an editor between bursts of typing: kspec's
    # engine then gives the memory its requests freed back (engine/serve/freed_memory.py)
    await asyncio.sleep(IDLE_TRIM_S + IDLE_SETTLE_S)
    idle = {server.name: resident_mb(server.process.pid) for server in servers}
    report["resident_idle_mb"] = idle
    report["kspec_idle_rss_over_llama"] = round(idle[servers[0].name]["VmRSS"] / idle[servers[1].name]["VmRSS"], 2)
    return report


async def _cold_prefill(servers: list[PeerServer]) -> dict[str, Any]:
    """Each server asked for one token after a window it has not seen, alternating: prompt tokens
    per second of the whole request (median), and the prompt tokens each evaluated."""
    rates: dict[str, list[float]] = {server.name: [] for server in servers}
    evaluated: dict[str, list[int]] = {server.name: [] for server in servers}
    for index, window in enumerate(cold_windows(COLD_REPEATS)):
        for server in servers if index % 2 == 0 else servers[::-1]:
            ms, _, prompt_n = await server.complete(completion_body(window, 1, 1))
            rates[server.name].append(1000 * prompt_n / ms)
            evaluated[server.name].append(prompt_n)
    tok_s = {name: round(statistics.median(values), 1) for name, values in rates.items()}
    kspec, llama = servers[0].name, servers[1].name
    return {"tok_s": tok_s, "prompt_tokens": evaluated, "kspec_ratio": round(tok_s[kspec] / tok_s[llama], 2)}


def bench_peer(engine: EngineConfig, config: PeerBenchConfig) -> dict[str, Any]:
    """The report of `kspec bench peer --json` (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="kspec-peer-") as folder:
        servers = _start(engine, config, Path(folder))
        try:
            measured = asyncio.run(_measure(servers, config))
        finally:
            for server in servers:
                server.stop()
        if config.starts:
            measured["start_alone"] = asyncio.run(_start_times(_specs(engine, config, Path(folder)), config))
    return {
        "gguf": config.gguf.name,
        "llama_server": str(config.llama_server),
        "threads": config.threads,
        "llama_server_args": {"slots": SLOTS, "context": CONTEXT},
        "new_tokens": config.new_tokens,
        "keystrokes": config.keystrokes,
        **measured,
    }
