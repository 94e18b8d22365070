"""The language server's view of an engine: in this process, or the shared daemon.

Both sides offer `start()` (returns at once; loading or connecting goes on in the
background and is reported through `on_status`), `complete(request)` (raises
EngineUnavailable / DeadlineExceeded / InputError; cancelling the awaiting task stops
the request in the engine at its next round) and `close()`.

The daemon client connects to the daemon for its EngineConfig, starting one when none
answers (under a spawn lock, so two editors starting together start one daemon), checks
the protocol version, and when the connection drops while in use it reports that once
and starts the daemon again. After more than `max_restarts` crashes within
`restart_window_s` with no answer in between (a crash loop) it starts none, but each
request still connects to a daemon that runs again (another editor started it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Protocol

from kspec.engine.api import CompletionRequest, CompletionResult, EarlyAnswer
from kspec.engine.config import EngineConfig, to_flags
from kspec.engine.serve.platform import unix_only
from kspec.engine.errors import DeadlineExceeded, EngineUnavailable, InputError, ProtocolError
from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.network import EngineUrl, client_tls
from kspec.engine.serve.runner import EngineFactory, EngineRunner, default_engine_factory
from kspec.engine.serve.runtime import DaemonPaths
from kspec.engine.serve.status import ERROR, LOADING, Status
from kspec.engine.serve.wire import PROTOCOL_VERSION, Cancel, Complete, Failed, Final, Hello, Interim, Message, decode, envelope, read_frame, send

log = logging.getLogger("kspec.client")

MAX_LOG_BYTES = 4 * 1024 * 1024  # a daemon's log is started afresh beyond this
# A daemon we start exits this long after its last client disconnected (its model's memory
# goes with it); an editor opened again within it finds the model warm.
DAEMON_IDLE_TIMEOUT_S = 10.0
StatusCallback = Callable[[Status], None]  # ERROR statuses are shown to the user, once each
IDLE, CONNECTING, CONNECTED, CLOSED = "idle", "connecting", "connected", "closed"  # DaemonEngine.state
CLOSED_MESSAGE = "the engine client was closed (its settings changed, or the server is exiting)"


class EngineClient(Protocol):
    @property
    def status(self) -> Status: ...

    async def start(self) -> None: ...

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        """The final answer; an engine that answers early (`request.first_answer_ms`) calls
        `early(interim)` first, on this loop, and again each time the interim answer grew.
        Engines that cannot, never call it."""
        ...

    def close(self) -> None: ...

    def join(self, timeout_s: float) -> bool: ...


class InProcessEngine:
    """The engine on a worker thread of this process (tests, a single editor)."""

    def __init__(self, config: Any, on_status: StatusCallback, factory: EngineFactory = default_engine_factory, slot: LoadSlot | None = None):
        self._runner = EngineRunner(config, factory, on_status, slot=slot)

    @property
    def status(self) -> Status:
        return self._runner.status

    async def start(self) -> None:
        self._runner.start()

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        return await self._runner.complete(request, early)

    def close(self) -> None:
        self._runner.stop()

    def join(self, timeout_s: float) -> bool:
        return self._runner.join(timeout_s)


class UnusableEngine:
    """Settings that cannot give an engine: reports why once, answers nothing."""

    def __init__(self, message: str, on_status: StatusCallback):
        self._status = Status(ERROR, message)
        self._on_status = on_status

    @property
    def status(self) -> Status:
        return self._status

    async def start(self) -> None:
        self._on_status(self._status)

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        raise EngineUnavailable(self._status.message)

    def close(self) -> None:
        pass

    def join(self, timeout_s: float) -> bool:
        return True


@dataclass(frozen=True)
class DaemonOptions:
    config: EngineConfig = field(default_factory=EngineConfig)  # what the daemon serves (and which daemon: DaemonPaths)
    folder: Path | None = None  # runtime dir; None: $XDG_RUNTIME_DIR/kspec or a private temp dir
    connect_timeout_s: float = 120.0  # a cold start imports torch and loads the model
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = DAEMON_IDLE_TIMEOUT_S  # passed to a daemon we start
    max_restarts: int = 3
    restart_window_s: float = 300.0
    python: str = sys.executable
    url: EngineUrl | None = None  # a network engine (`kspec engine --listen`; tcp:// or tls://), never spawned
    token: str | None = None  # that engine's token
    ca_file: Path | None = None  # tls://: trust this certificate / CA instead of the system's

    def paths(self) -> DaemonPaths:
        return DaemonPaths.for_config(self.config, self.folder)


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int | None
    pending: dict[str, asyncio.Future] = field(default_factory=dict)
    early: dict[str, EarlyAnswer] = field(default_factory=dict)  # interim-answer callbacks by request id
    reader_task: asyncio.Task | None = None
    alive: bool = True

    def deliver(self, message: Message) -> bool:
        """A request's event to whoever waits for it; False when nobody does any more."""
        future = self.pending.get(message.id) if isinstance(message, (Interim, Final, Failed)) and message.id else None
        if future is None or future.done():
            return False
        if isinstance(message, Interim):
            callback = self.early.get(message.id)  # one per interim answer
            if callback is not None:
                try:
                    callback(message.result)
                except (KeyError, TypeError, ValueError) as exc:  # the receiver's own mistake must not end the connection
                    log.warning("an early answer could not be taken: %s", exc)
        elif isinstance(message, Final):
            future.set_result(message.result)
        else:
            future.set_exception(message.error())
        return True


class DaemonEngine:
    """Client of the shared `kspec engine` daemon."""

    def __init__(self, options: DaemonOptions, on_status: StatusCallback):
        self.options = options
        self.paths = options.paths()
        self.where = str(options.url) if options.url else str(self.paths.socket)
        self._on_status = on_status
        self._status = Status(LOADING, "connecting to the engine daemon", progress=0.0, model=options.config.model or "default")
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task | None = None
        self._closing = False
        self._crashes: list[float] = []  # when connections in use were lost (within restart_window_s)
        self._ids = itertools.count(1)
        self._children: list[subprocess.Popen] = []

    @property
    def status(self) -> Status:
        return self._status

    @property
    def log_file(self) -> Path | None:
        """Where a local daemon writes its log (None for a network engine: its own host's)."""
        return None if self.options.url is not None else self.paths.log

    async def start(self) -> None:
        self._begin_connecting()

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        connection = await self._wait_connection(request.deadline_ms / 1000)
        request_id = f"r{next(self._ids)}"
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        connection.pending[request_id] = future
        if early is not None:
            connection.early[request_id] = early
        try:
            send(connection.writer, Complete(request_id, request))
            return await future
        except asyncio.CancelledError:
            if connection.alive:
                send(connection.writer, Cancel(request_id))
            raise
        finally:
            connection.pending.pop(request_id, None)
            connection.early.pop(request_id, None)

    def close(self) -> None:
        self._closing = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            self._drop(self._connection, EngineUnavailable(CLOSED_MESSAGE))
        for child in self._children:
            child.poll()  # reap a daemon that already exited; live ones keep serving other editors

    def join(self, timeout_s: float) -> bool:
        return True  # nothing runs in this process

    # --- connection management ---------------------------------------------------

    def _set_status(self, status: Status) -> None:
        self._status = status
        self._on_status(status)

    def _gave_up(self) -> bool:
        """Too many crashes lately: no daemon is started (one that is running is still used)."""
        now = time.monotonic()
        self._crashes = [t for t in self._crashes if now - t < self.options.restart_window_s]
        return len(self._crashes) > self.options.max_restarts

    @property
    def state(self) -> str:
        """CLOSED (for good, after close()), CONNECTED, CONNECTING, or IDLE (not started, or
        the last attempt failed: the next request tries again). Every method acts on the
        state it finds; none assumes an earlier one ran (settings may close this client
        between any two of them)."""
        if self._closing:
            return CLOSED
        if self._connection is not None and self._connection.alive:
            return CONNECTED
        if self._connecting is not None and not self._connecting.done():
            return CONNECTING
        return IDLE

    def _begin_connecting(self) -> asyncio.Task | None:
        """The attempt under way (started now when IDLE); None once CLOSED."""
        state = self.state
        if state == IDLE:
            self._connecting = asyncio.ensure_future(self._connect(spawn=not self._gave_up()))
            self._connecting.add_done_callback(self._connected)
        return self._connecting if state in (IDLE, CONNECTING) else None

    def _connected(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not self._gave_up():  # after giving up, the status says so already
            message = f"cannot reach the engine daemon: {error} (log: {self.paths.log})"
            log.error("%s", message)
            self._set_status(Status(ERROR, message, model=self.options.config.model or "default"))

    async def _wait_connection(self, timeout_s: float) -> _Connection:
        if self.state == CONNECTED and self._connection is not None:
            return self._connection
        attempt = self._begin_connecting()  # after giving up: only to a daemon that runs again (another editor started it)
        if attempt is not None:
            try:
                await asyncio.wait_for(asyncio.shield(attempt), timeout_s)
            except asyncio.TimeoutError:
                raise DeadlineExceeded("the engine daemon is still starting") from None
            except asyncio.CancelledError:
                if self._closing and attempt.cancelled() and not _current_task_cancelling():
                    raise EngineUnavailable(CLOSED_MESSAGE) from None  # the attempt was cancelled by close(), not this request
                raise
            except Exception as exc:
                raise EngineUnavailable(str(exc)) from exc
        if self.state != CONNECTED or self._connection is None:
            raise EngineUnavailable(CLOSED_MESSAGE if self.state == CLOSED else "the engine daemon is not connected")
        return self._connection

    async def _connect(self, spawn: bool) -> None:
        deadline = time.monotonic() + self.options.connect_timeout_s
        connection = await self._try_connect()
        if connection is None and self.options.url is not None:
            raise EngineUnavailable(f"no engine answers at {self.options.url}")
        if connection is None and not spawn:
            raise EngineUnavailable(self._status.message)
        if connection is None:
            connection = await self._spawn_and_connect(deadline)
        self._connection = connection
        connection.reader_task = asyncio.ensure_future(self._read(connection))

    async def _try_connect(self) -> _Connection | None:
        try:
            url = self.options.url
            if url is not None:
                tls = client_tls(self.options.ca_file) if url.secure else None
                reader, writer = await asyncio.open_connection(url.host, url.port, ssl=tls, server_hostname=url.host if tls else None)
            else:
                reader, writer = await asyncio.open_unix_connection(str(self.paths.socket))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except ssl.SSLError as exc:
            raise ProtocolError(f"TLS with {self.where} failed: {exc.reason or exc}") from exc
        try:
            return await asyncio.wait_for(self._handshake(reader, writer), self.options.handshake_timeout_s)
        except (asyncio.TimeoutError, ProtocolError, ConnectionError, asyncio.IncompleteReadError) as exc:
            writer.close()
            if isinstance(exc, ProtocolError):
                raise
            return None

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Connection:
        send(writer, Hello(PROTOCOL_VERSION, token=self.options.token))
        body = await read_frame(reader)
        reply = decode(body) if body is not None else None
        if isinstance(reply, Failed):
            raise ProtocolError(f"the engine daemon refused the connection: {reply.message}")
        if not isinstance(reply, Hello):
            raise ProtocolError(f"the engine daemon at {self.where} did not answer the handshake")
        if reply.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"the engine daemon at {self.where} speaks protocol {reply.version!r}, "
                f"this server {PROTOCOL_VERSION}: stop it (pid {reply.pid})"
            )
        self._set_status(reply.status or Status(LOADING, "connected", engine_pid=reply.pid))
        return _Connection(reader, writer, reply.pid)

    async def _spawn_and_connect(self, deadline: float) -> _Connection:
        lock = _try_lock(self.paths.lock.with_suffix(".spawn"))
        child: subprocess.Popen | None = None
        try:
            if lock is not None:
                connection = await self._try_connect()  # someone may have finished starting one
                if connection is not None:
                    return connection
                child = spawn_daemon(self.options, self.paths)
                self._children = [c for c in self._children if c.poll() is None] + [child]
            while time.monotonic() < deadline:
                connection = await self._try_connect()
                if connection is not None:
                    return connection
                if child is not None and child.poll() not in (None, 0):
                    raise EngineUnavailable(f"the engine daemon exited with code {child.returncode}: {_last_line(self.paths.log)}")
                await asyncio.sleep(0.05)
            raise EngineUnavailable(f"the engine daemon did not answer within {self.options.connect_timeout_s:.0f} s")
        finally:
            if lock is not None:
                lock.close()

    async def _read(self, connection: _Connection) -> None:
        reason = "the engine daemon closed the connection"
        try:
            while (body := await read_frame(connection.reader)) is not None:
                self._dispatch(connection, body)
        except (ProtocolError, ConnectionError, OSError) as exc:
            reason = f"the connection to the engine daemon failed: {exc}"
        finally:
            if connection.alive:
                self._lost(connection, reason)

    def _dispatch(self, connection: _Connection, body: bytes) -> None:
        try:
            message = decode(body)
        except (ProtocolError, InputError) as exc:
            about = envelope(body)
            future = connection.pending.get(about.id) if about.id is not None else None
            if future is not None and not future.done() and about.type == Final.__struct_config__.tag:
                future.set_exception(EngineUnavailable(f"malformed result from the engine daemon: {exc}"))
            else:
                log.warning("malformed message from the engine daemon: %s", exc)
            return
        if isinstance(message, Status):
            self._set_status(message)
        elif connection.deliver(message) and isinstance(message, Final):
            self._crashes.clear()  # it answers: a crash after this one is no crash loop

    def _drop(self, connection: _Connection, error: Exception) -> None:
        connection.alive = False
        for future in connection.pending.values():
            if not future.done():
                future.set_exception(error)
        connection.pending.clear()
        connection.writer.close()
        if connection.reader_task is not None and connection.reader_task is not asyncio.current_task():
            connection.reader_task.cancel()
        if self._connection is connection:
            self._connection = None

    def _lost(self, connection: _Connection, reason: str) -> None:
        self._drop(connection, EngineUnavailable(reason))
        if self._closing:
            return
        self._crashes.append(time.monotonic())
        for child in self._children:
            child.poll()
        if self._gave_up():
            message = (
                f"the engine daemon stopped {len(self._crashes)} times in {self.options.restart_window_s:.0f} s; not restarting it "
                f"(log: {self.paths.log}); a daemon started again is used"
            )
            self._set_status(Status(ERROR, message, model=self.options.config.model or "default"))
            return
        message = f"the engine daemon stopped unexpectedly ({reason}); restarting it"
        log.warning("%s", message)
        self._set_status(Status(ERROR, message, model=self.options.config.model or "default"))
        self._begin_connecting()


def _current_task_cancelling() -> bool:
    """This task itself was asked to stop (Python 3.11+ tells; before, assume it was)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


def spawn_daemon(options: DaemonOptions, paths: DaemonPaths) -> subprocess.Popen:
    """Start `kspec engine` for these options on the daemon's socket, in its own session (it
    outlives this editor and serves the others), its output in the daemon's log."""
    command = [
        options.python, "-m", "kspec.cli.main", "engine", *to_flags(options.config),
        "--socket", str(paths.socket), "--idle-timeout", str(options.idle_timeout_s),
    ]  # fmt: skip
    log.info("starting the engine daemon: %s", " ".join(command))
    too_big = paths.log.exists() and paths.log.stat().st_size > MAX_LOG_BYTES
    with open(paths.log, "wb" if too_big else "ab") as log_file:
        os.chmod(paths.log, 0o600)
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
            close_fds=True,
        )  # the environment as it is: `options.python` is the interpreter kspec is installed in


def _try_lock(path: Path) -> IO[bytes] | None:
    """An exclusive flock on `path`, or None when another process holds it."""
    fcntl = unix_only("fcntl")
    handle = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"

