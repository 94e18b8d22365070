"""Runner, daemon and daemon client with a fake engine: cancellation, deadlines, crashes, protocol checks."""

from __future__ import annotations

import asyncio
import platform
import sys
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kspec.engine.api import CancelToken, Completion, CompletionRequest, CompletionResult
from kspec.engine.config import EngineConfig
from kspec.engine.errors import InputError, ModelLoadError
from kspec.lsp_server import engine_client
from kspec.engine.serve.daemon import Daemon
from kspec.lsp_server.engine_client import DaemonEngine, DaemonOptions, InProcessEngine
from kspec.engine.serve.network import parse_engine_url
from kspec.engine.serve.runtime import DaemonPaths
from kspec.engine.serve.wire import PROTOCOL_VERSION, Cancel, Complete, Failed, Final, Hello, Message, decode, encode, read_frame, write_frame, send
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable
from kspec.engine.serve.runner import EngineRunner
from kspec.engine.serve.status import Status


CONFIG = EngineConfig(model="fake", progress=False)


class FakeEngine:
    """Echoes the prefix reversed; prefix "block" decodes until cancelled (1 ms rounds)."""

    model_name = "fake"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped_by_cancel = threading.Event()
        self.calls = 0

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        self.calls += 1
        if request.prefix == "bad":
            raise InputError("bad request")
        if request.prefix == "block":
            self.started.set()
            end = time.monotonic() + 20
            while time.monotonic() < end:
                if cancel is not None and cancel.cancelled:
                    self.stopped_by_cancel.set()
                    break
                time.sleep(0.001)  # one decode round
            return CompletionResult([], self.model_name)
        return CompletionResult([Completion(request.prefix[::-1], 0.0)], self.model_name, {"total": 1.0})


def factory_for(engine: FakeEngine):
    return lambda config, on_progress: engine


async def wait_thread_event(event: threading.Event, timeout: float = 10) -> None:
    assert await asyncio.to_thread(event.wait, timeout), "timed out"


async def test_in_process_answers_and_reports_ready() -> None:
    statuses: list[Status] = []
    engine = InProcessEngine(CONFIG, statuses.append, factory_for(FakeEngine()))
    await engine.start()
    result = await asyncio.wait_for(engine.complete(CompletionRequest(prefix="abc")), 10)
    assert [c.text for c in result.completions] == ["cba"]
    assert [s.state for s in statuses] == ["loading", "ready"]
    with pytest.raises(InputError):
        await engine.complete(CompletionRequest(prefix="bad"))
    engine.close()
    assert engine.join(5)


async def test_cancelling_the_caller_stops_the_engine_at_its_next_round() -> None:
    fake = FakeEngine()
    engine = InProcessEngine(CONFIG, lambda s: None, factory_for(fake))
    await engine.start()
    task = asyncio.ensure_future(engine.complete(CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    task.cancel()
    await wait_thread_event(fake.stopped_by_cancel)
    result = await asyncio.wait_for(engine.complete(CompletionRequest(prefix="next")), 10)  # the worker is free
    assert result.completions[0].text == "txen"
    engine.close()


async def test_queued_requests_past_their_deadline_are_not_run() -> None:
    fake = FakeEngine()
    engine = InProcessEngine(CONFIG, lambda s: None, factory_for(fake))
    await engine.start()
    blocker = asyncio.ensure_future(engine.complete(CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    late = asyncio.ensure_future(engine.complete(CompletionRequest(prefix="late", deadline_ms=50)))
    cancelled = asyncio.ensure_future(engine.complete(CompletionRequest(prefix="gone")))
    await asyncio.sleep(0)
    cancelled.cancel()
    done, _ = await asyncio.wait({late}, timeout=0.2)  # the deadline passes while "block" runs
    assert not done
    blocker.cancel()
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(late, 10)
    assert fake.calls == 1  # neither "late" nor the cancelled one reached the engine
    engine.close()


async def test_load_failure_is_an_error_status_and_unavailable() -> None:
    def broken(config: Any, on_progress: Any) -> Any:
        raise ModelLoadError("no such model: /nowhere")

    statuses: list[Status] = []
    engine = InProcessEngine(CONFIG, statuses.append, broken)
    await engine.start()
    with pytest.raises(EngineUnavailable, match="/nowhere"):
        await asyncio.wait_for(engine.complete(CompletionRequest(prefix="x")), 10)
    assert statuses[-1].state == "error" and "/nowhere" in statuses[-1].message
    engine.close()


# --- daemon and its client ---------------------------------------------------------------


@pytest.fixture
def short_dir() -> Any:
    folder = Path(tempfile.mkdtemp(prefix="ks-"))
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


async def serve(daemon: Daemon, socket: Path) -> asyncio.Task:
    task = asyncio.ensure_future(daemon.serve_unix(socket))
    deadline = time.monotonic() + 10
    while not socket.exists():
        assert time.monotonic() < deadline, "the daemon did not bind"
        await asyncio.sleep(0.01)
    return task


async def test_daemon_client_round_trip_cancel_and_crash(short_dir: Path) -> None:
    fake = FakeEngine()
    options = DaemonOptions(config=EngineConfig(model="fake"), folder=short_dir, connect_timeout_s=5, max_restarts=0)
    paths = options.paths()
    daemon = Daemon(CONFIG, factory_for(fake), idle_timeout_s=60)
    served = await serve(daemon, paths.socket)
    assert stat.S_IMODE(paths.socket.stat().st_mode) == 0o600

    statuses: list[Status] = []
    client = DaemonEngine(options, statuses.append)
    await client.start()
    result = await asyncio.wait_for(client.complete(CompletionRequest(prefix="hello")), 10)
    assert result.completions[0].text == "olleh"
    assert statuses[-1].engine_pid == os.getpid()
    with pytest.raises(InputError, match="bad request"):
        await asyncio.wait_for(client.complete(CompletionRequest(prefix="bad")), 10)

    task = asyncio.ensure_future(client.complete(CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    task.cancel()  # sends cancel(id)
    await wait_thread_event(fake.stopped_by_cancel)

    # The daemon goes away under a pending request: it fails at once, reported as an error status.
    fake.started.clear()
    pending = asyncio.ensure_future(client.complete(CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    daemon._stop.set()
    with pytest.raises(EngineUnavailable):
        await asyncio.wait_for(pending, 10)
    await asyncio.wait_for(served, 10)
    assert statuses[-1].state == "error" and "not restarting" in statuses[-1].message  # max_restarts=0
    client.close()


async def test_client_disconnect_cancels_its_requests(short_dir: Path) -> None:
    fake = FakeEngine()
    socket = short_dir / "d.sock"
    daemon = Daemon(CONFIG, factory_for(fake), idle_timeout_s=60)
    served = await serve(daemon, socket)
    reader, writer = await asyncio.open_unix_connection(str(socket))
    send(writer, Hello(PROTOCOL_VERSION))
    assert isinstance(decode(await read_frame(reader)), Hello)
    send(writer, Complete("1", CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    writer.close()
    await wait_thread_event(fake.stopped_by_cancel)
    daemon._stop.set()
    await asyncio.wait_for(served, 10)


async def test_daemon_refuses_bad_peers(short_dir: Path) -> None:
    socket = short_dir / "d.sock"
    daemon = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60, token="secret")
    served = await serve(daemon, socket)

    async def hello(body: bytes) -> Message:
        reader, writer = await asyncio.open_unix_connection(str(socket))
        write_frame(writer, body)
        reply = await asyncio.wait_for(read_frame(reader), 10)
        writer.close()
        assert reply is not None
        return decode(reply)

    assert await hello(encode(Hello(PROTOCOL_VERSION, token="guess"))) == Failed(None, "protocol", "bad token")
    assert await hello(encode(Cancel("1"))) == Failed(None, "protocol", "expected a hello")
    assert await hello(b"\xc1") == Failed(None, "protocol", "expected a hello")  # no msgpack at all
    assert await hello(msgspec.msgpack.encode({"type": "hello", "version": "one"})) == Failed(None, "protocol", "expected a hello")
    assert isinstance(await hello(encode(Hello(PROTOCOL_VERSION, token="secret"))), Hello)

    reader, writer = await asyncio.open_unix_connection(str(socket))
    send(writer, Hello(PROTOCOL_VERSION, token="secret"))
    await read_frame(reader)
    writer.write((1 << 30).to_bytes(4, "big"))  # a 1 GiB frame: the daemon hangs up
    assert await asyncio.wait_for(reader.read(), 10) == b""
    daemon._stop.set()
    await asyncio.wait_for(served, 10)


async def test_a_message_that_does_not_decode_fails_alone_with_a_one_line_error(short_dir: Path) -> None:
    """A wrong-typed request field, an unknown type, a frame that is no msgpack: each answered with
    the user's one-line error for the request it names, and the connection keeps serving."""
    socket = short_dir / "d.sock"
    daemon = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60)
    served = await serve(daemon, socket)
    reader, writer = await asyncio.open_unix_connection(str(socket))
    send(writer, Hello(PROTOCOL_VERSION))
    assert isinstance(decode(await read_frame(reader)), Hello)

    async def answer(body: bytes) -> Message:
        write_frame(writer, body)
        while isinstance(reply := decode(await asyncio.wait_for(read_frame(reader), 10)), Status):
            pass
        return reply

    wrong = msgspec.msgpack.encode({"type": "complete", "id": "r1", "request": {"prefix": "x", "k": "four"}})
    assert await answer(wrong) == Failed("r1", "input", "request field 'k': Expected `int`, got `str`")
    assert await answer(msgspec.msgpack.encode({"type": "shout", "id": "r2"})) == Failed("r2", "protocol", "unknown message type 'shout'")
    assert await answer(b"\xc1") == Failed(None, "protocol", "malformed frame: MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)")
    final = await answer(encode(Complete("r3", CompletionRequest(prefix="ab"))))
    assert isinstance(final, Final) and final.result.completions[0].text == "ba"
    writer.close()
    daemon._stop.set()
    await asyncio.wait_for(served, 10)


async def test_a_malformed_result_fails_its_request_and_not_the_connection(short_dir: Path) -> None:
    options = DaemonOptions(config=EngineConfig(model="odd"), folder=short_dir, connect_timeout_s=5)

    async def odd_daemon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        send(writer, Hello(PROTOCOL_VERSION, pid=1, status=Status("ready", model="odd")))
        while (body := await read_frame(reader)) is not None:
            request = decode(body)
            assert isinstance(request, Complete)
            if request.request.prefix == "bad":
                write_frame(writer, msgspec.msgpack.encode({"type": "result", "id": request.id, "result": {"completions": "nope"}}))
            else:
                write_frame(writer, encode(Final(request.id, CompletionResult([Completion("ok", 0.0)], "odd"))))

    server = await asyncio.start_unix_server(odd_daemon, str(options.paths().socket))
    client = DaemonEngine(options, lambda status: None)
    with pytest.raises(EngineUnavailable, match="malformed result from the engine daemon: malformed 'result' message"):
        await asyncio.wait_for(client.complete(CompletionRequest(prefix="bad")), 10)
    assert (await asyncio.wait_for(client.complete(CompletionRequest(prefix="good")), 10)).completions[0].text == "ok"
    client.close()
    server.close()


async def test_idle_daemon_exits_and_removes_its_socket(short_dir: Path) -> None:
    socket = short_dir / "d.sock"
    served = await serve(Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=0.2), socket)
    await asyncio.wait_for(served, 10)
    assert not socket.exists()


async def test_protocol_version_mismatch_is_a_clear_error(short_dir: Path) -> None:
    options = DaemonOptions(config=EngineConfig(model="old"), folder=short_dir, connect_timeout_s=5)
    paths = DaemonPaths.for_config(options.config, short_dir)

    async def old_daemon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        send(writer, Hello(PROTOCOL_VERSION + 1, pid=1))

    server = await asyncio.start_unix_server(old_daemon, str(paths.socket))
    statuses: list[Status] = []
    client = DaemonEngine(options, statuses.append)
    with pytest.raises(EngineUnavailable, match="speaks protocol"):
        await asyncio.wait_for(client.complete(CompletionRequest(prefix="x")), 10)
    assert statuses[-1].state == "error" and "speaks protocol" in statuses[-1].message
    client.close()
    server.close()


def test_spawn_lock_is_exclusive(short_dir: Path) -> None:
    first = engine_client._try_lock(short_dir / "x.spawn")
    assert first is not None
    assert engine_client._try_lock(short_dir / "x.spawn") is None
    first.close()
    again = engine_client._try_lock(short_dir / "x.spawn")
    assert again is not None
    again.close()


async def test_tcp_daemon_needs_its_token() -> None:
    daemon = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60, token="s3cret")
    served = asyncio.ensure_future(daemon.serve_tcp("127.0.0.1", 0))
    deadline = time.monotonic() + 10
    while daemon.bound_port is None:
        assert time.monotonic() < deadline and not served.done()
        await asyncio.sleep(0.01)
    address = ("127.0.0.1", daemon.bound_port)

    good = DaemonEngine(DaemonOptions(config=EngineConfig(model="fake"), url=parse_engine_url(f"tcp://{address[0]}:{address[1]}"), token="s3cret", connect_timeout_s=5), lambda s: None)
    result = await asyncio.wait_for(good.complete(CompletionRequest(prefix="tcp")), 10)
    assert result.completions[0].text == "pct"
    good.close()

    statuses: list[Status] = []
    bad = DaemonEngine(DaemonOptions(config=EngineConfig(model="fake"), url=parse_engine_url(f"tcp://{address[0]}:{address[1]}"), token="guess", connect_timeout_s=5), statuses.append)
    with pytest.raises(EngineUnavailable, match="bad token"):
        await asyncio.wait_for(bad.complete(CompletionRequest(prefix="tcp")), 10)
    bad.close()
    daemon._stop.set()
    await asyncio.wait_for(served, 10)

    with pytest.raises(Exception, match="token"):
        await Daemon(CONFIG, factory_for(FakeEngine())).serve_tcp("127.0.0.1", 0)


# --- no worker left behind, no permanent giving up ---------------------------------------


async def test_stop_with_requests_queued_ends_the_worker() -> None:
    """stop() while the worker is busy (a setting that selects the engine changed while
    requests were running or queued): the worker stops after that round rather than waiting
    for work for good (+1 thread and a model per switch)."""
    fake = FakeEngine()
    runner = EngineRunner(CONFIG, factory_for(fake), lambda s: None)
    runner.start()
    running = asyncio.ensure_future(runner.complete(CompletionRequest(prefix="block")))
    await wait_thread_event(fake.started)
    queued = [asyncio.ensure_future(runner.complete(CompletionRequest(prefix=f"q{index}"))) for index in range(3)]
    await asyncio.sleep(0)  # one turn of the loop: each queues its job (no time passes)
    runner.stop()
    assert await asyncio.to_thread(runner.join, 10), "the worker thread did not end"
    for outcome in await asyncio.wait_for(asyncio.gather(running, *queued, return_exceptions=True), 10):
        assert isinstance(outcome, (CompletionResult, EngineUnavailable)), outcome  # every request answered
    with pytest.raises(EngineUnavailable, match="stopped"):
        await asyncio.wait_for(runner.complete(CompletionRequest(prefix="late")), 10)


def test_the_worker_is_never_a_daemon_thread_whoever_starts_it() -> None:
    """The keystroke bench starts a server (so its engine) on a daemon thread: its worker
    inherited the flag, and at exit finalization ended it inside torch's native code, which
    aborted the process ("terminate called without an active exception"). The worker must
    keep the interpreter's exit waiting instead."""
    runners: list[EngineRunner] = []

    def make_and_start_on_this_thread() -> None:
        async def start_and_stop() -> None:
            runner = EngineRunner(CONFIG, factory_for(FakeEngine()), lambda s: None)
            runners.append(runner)
            runner.start()
            runner.stop()

        asyncio.run(start_and_stop())

    starter = threading.Thread(target=make_and_start_on_this_thread, daemon=True)
    starter.start()
    starter.join(10)
    assert len(runners) == 1 and runners[0].join(10), "the worker thread did not end"
    assert runners[0]._thread.daemon is False


async def test_an_idle_engine_gives_freed_memory_back_once_per_idle_spell(monkeypatch) -> None:
    """After loading, and once it has waited IDLE_TRIM_S with nothing to do, the worker hands
    the C heap's free pages back (engine/serve/freed_memory.py); once per idle spell, not per wait."""
    from kspec.engine.serve import runner as runner_module

    trims: list[float] = []
    answered_at: list[float] = []
    trimmed_after_answer = threading.Event()

    def trim() -> bool:
        trims.append(time.monotonic())
        if answered_at and trims[-1] >= answered_at[0]:
            trimmed_after_answer.set()
        return True

    monkeypatch.setattr(runner_module, "return_freed_memory", trim)
    monkeypatch.setattr(runner_module, "IDLE_TRIM_S", 0.05)
    runner = EngineRunner(CONFIG, factory_for(FakeEngine()), lambda s: None)
    runner.start()
    answered = await asyncio.wait_for(runner.complete(CompletionRequest(prefix="x")), 10)
    answered_at.append(time.monotonic())
    await wait_thread_event(trimmed_after_answer)
    runner.stop()
    assert await asyncio.to_thread(runner.join, 10)
    assert isinstance(answered, CompletionResult)
    assert 2 <= len(trims) <= 3  # after the load; after the answer's idle spell; at most one spell before the request came


def test_freed_memory_goes_back_on_glibc() -> None:
    from kspec.engine.freed_memory import return_freed_memory

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert return_freed_memory() is True


async def test_after_giving_up_a_daemon_running_again_is_used(short_dir: Path) -> None:
    options = DaemonOptions(config=EngineConfig(model="fake"), folder=short_dir, connect_timeout_s=5, max_restarts=0)
    paths = options.paths()
    first = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60)
    served = await serve(first, paths.socket)
    statuses: list[Status] = []
    changed = asyncio.Event()

    def on_status(status: Status) -> None:
        statuses.append(status)
        changed.set()

    client = DaemonEngine(options, on_status)
    await client.start()
    assert (await asyncio.wait_for(client.complete(CompletionRequest(prefix="ab")), 10)).completions[0].text == "ba"

    first._stop.set()  # the daemon goes away (a crash, as the client sees it)
    await asyncio.wait_for(served, 10)
    while not any("not restarting" in s.message for s in statuses):  # max_restarts=0: gave up at once
        changed.clear()
        await asyncio.wait_for(changed.wait(), 10)
    with pytest.raises(EngineUnavailable):
        await asyncio.wait_for(client.complete(CompletionRequest(prefix="cd")), 10)

    # Another editor starts the daemon again: this client uses it (not [] for good).
    again = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60)
    served_again = await serve(again, paths.socket)
    result = await asyncio.wait_for(client.complete(CompletionRequest(prefix="ef")), 10)
    assert result.completions[0].text == "fe"
    client.close()
    again._stop.set()
    await asyncio.wait_for(served_again, 10)


async def test_text_msgpack_cannot_carry_is_an_input_error(short_dir: Path) -> None:
    """A languageId (or path) with a lone surrogate ("\\ud800" in JSON) made the daemon client's
    msgpack encoder raise UnicodeEncodeError: the language server answered -32603."""
    options = DaemonOptions(config=EngineConfig(model="fake"), folder=short_dir, connect_timeout_s=5)
    daemon = Daemon(CONFIG, factory_for(FakeEngine()), idle_timeout_s=60)
    served = await serve(daemon, options.paths().socket)
    client = DaemonEngine(options, lambda s: None)
    with pytest.raises(InputError, match="lone surrogate"):
        await asyncio.wait_for(client.complete(CompletionRequest(prefix="x", language="\ud800")), 10)
    assert (await asyncio.wait_for(client.complete(CompletionRequest(prefix="ok")), 10)).completions[0].text == "ko"
    client.close()
    daemon._stop.set()
    await asyncio.wait_for(served, 10)
