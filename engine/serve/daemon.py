"""`kspec engine`: one warm model shared by every editor window of this user.

Start-up order keeps a second daemon cheap and harmless: take the lock (another daemon
holds it -> exit 0 at once), bind the socket (0600, in the 0700 runtime dir), then load
the model on the worker thread while already answering handshakes ("loading"). Requests
of all clients are decoded together (continuous batching, engine/batching.py);
`cancel(id)` stops one at its next decode round; a client that disconnects has its
requests cancelled. With no client for `--idle-timeout` seconds the daemon exits and
removes its socket (a network daemon, `--listen`, waits forever unless told).

`--listen HOST:PORT` serves the same protocol over TCP (loopback by default; every
client must present the token; TLS with `--tls-cert/--tls-key`), and on the same port
the OpenAI-compatible HTTP endpoint (engine/serve/http_api.py), told apart by the first
bytes of a connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from kspec.engine.serve.loop_errors import quiet_resource_errors
from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.config import EngineConfig
from kspec.engine.errors import InputError, KspecError, ProtocolError
from kspec.engine.serve.admission import Admission, AdmissionLimits
from kspec.engine.serve.http_api import HttpApi, looks_like_http, serve_http
from kspec.engine.serve.auth import tokens_match
from kspec.engine.serve.metrics import EngineMetrics
from kspec.engine.serve.platform import unix_only
from kspec.engine.serve.runner import EngineFactory, EngineRunner, default_engine_factory
from kspec.engine.serve.runtime import DaemonPaths
from kspec.engine.serve.status import READY, Status
from kspec.engine.serve.wire import PROTOCOL_VERSION, Cancel, Complete, Failed, Final, Hello, Interim, Message, decode, envelope, read_frame, send

log = logging.getLogger("kspec.daemon")
MAX_UNIX_PATH = 107


class _Peer:
    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.jobs: dict[str, asyncio.Task] = {}

    def send(self, message: Message) -> None:
        if not self.writer.is_closing():
            send(self.writer, message)


class Daemon:
    def __init__(
        self,
        config: Any,
        factory: EngineFactory = default_engine_factory,
        idle_timeout_s: float | None = 900.0,  # None: never exit for lack of clients
        token: str | None = None,
        max_batch_requests: int = 16,
        metrics_open: bool = False,  # GET /metrics without the token
    ):
        self.runner = EngineRunner(config, factory, self._broadcast, max_batch_requests)
        self.idle_timeout_s = idle_timeout_s
        self.token = token
        self.metrics = EngineMetrics(queue_length=self.runner.queued)
        self.http = HttpApi(self._complete_http, self._model_name, self._ready, token, self.metrics.exposition, metrics_open)
        self._peers: set[_Peer] = set()
        self._stop = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self.bound_port: int | None = None
        self.admission = Admission(AdmissionLimits())  # connections that have not shown the token yet

    async def serve_unix(self, path: Path) -> None:
        if len(os.fsencode(str(path))) > MAX_UNIX_PATH:
            raise KspecError(f"socket path {path} is too long for a Unix socket; set XDG_RUNTIME_DIR to a shorter folder")
        path.unlink(missing_ok=True)  # we hold the lock: any socket file there is stale
        umask = os.umask(0o177)  # created 0600, no window where others could connect
        try:
            server = await asyncio.start_unix_server(self._serve_peer, str(path))
        finally:
            os.umask(umask)
        os.chmod(path, 0o600)
        log.info("listening on %s", path)
        try:
            await self._run(server)
        finally:
            path.unlink(missing_ok=True)

    async def serve_tcp(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """TCP (only when asked; the CLI defaults to loopback); `token` must be set.
        With `tls` every connection is TLS (msgpack and HTTP alike)."""
        if self.token is None:
            raise KspecError("a TCP engine daemon needs a token")
        server = await asyncio.start_server(self._serve_peer, host, port, ssl=tls)
        self.bound_port = server.sockets[0].getsockname()[1]
        scheme = "tls" if tls is not None else "tcp"
        print(f"kspec engine: listening on {scheme}://{host}:{self.bound_port} (and http{'s' if tls else ''}://{host}:{self.bound_port}/v1)", file=sys.stderr, flush=True)
        await self._run(server)

    async def _complete_http(self, request: CompletionRequest, document: str) -> tuple[CompletionResult, dict[str, str]]:
        return await self._observed("http", request), {}

    async def _observed(self, surface: str, request: CompletionRequest, early: Any = None) -> CompletionResult:
        """The runner's answer, counted in the metrics (latency, batching, prefix cache, errors)."""
        started = time.monotonic()
        self.metrics.in_flight.inc()
        try:
            result = await self.runner.complete(request, early)
        except (asyncio.CancelledError, Exception) as exc:
            self.metrics.failed(exc)
            raise
        finally:
            self.metrics.in_flight.dec()
        self.metrics.answered(surface, request.k, result.timing_ms, time.monotonic() - started)
        return result

    async def _model_name(self) -> str:
        return self.runner.status.model

    async def _ready(self) -> tuple[bool, str]:
        status = self.runner.status
        return status.state == READY, status.state if status.state == READY else f"{status.state}: {status.message}"

    async def _run(self, server: asyncio.AbstractServer) -> None:
        loop = asyncio.get_running_loop()
        quiet_resource_errors(loop)  # fd exhaustion: one line, not a traceback per failed accept
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        self.runner.start()
        self._arm_idle()
        try:
            async with server:
                await self._stop.wait()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            for peer in list(self._peers):
                peer.writer.close()
            self.runner.stop()

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        if self.idle_timeout_s is not None:
            self._idle = asyncio.get_running_loop().call_later(self.idle_timeout_s, self._idle_exit)

    def _idle_exit(self) -> None:
        if not self._peers:
            log.info("no client for %.0f s: exiting", self.idle_timeout_s)
            self._stop.set()

    def _broadcast(self, status: Status) -> None:
        message = self._with_pid(status)
        for peer in list(self._peers):
            peer.send(message)

    async def _serve_peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _Peer(writer)
        self.admission.arrive(writer)
        try:
            try:
                first = await asyncio.wait_for(reader.readexactly(4), self.admission.limits.timeout_s)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return
            if looks_like_http(first):
                await serve_http(reader, writer, first, self.http, self.admission)
                return
            if not await self._handshake(peer, reader, first):
                return
            self.admission.authenticated(writer)
            self._peers.add(peer)
            if self._idle is not None:
                self._idle.cancel()
            while (body := await read_frame(reader)) is not None:
                self._handle(peer, body)
        except (ProtocolError, ConnectionError) as exc:  # before the token: quiet, a flood must not flood the log
            (log.warning if peer in self._peers else log.debug)("dropping a client: %s", exc)
        finally:
            self.admission.leave(writer)
            self._peers.discard(peer)
            for job in peer.jobs.values():
                job.cancel()
            writer.close()
            if not self._peers:
                self._arm_idle()

    async def _handshake(self, peer: _Peer, reader: asyncio.StreamReader, header: bytes) -> bool:
        limits = self.admission.limits  # before the token is verified: a small frame, soon
        try:
            body = await asyncio.wait_for(read_frame(reader, header, limits.bytes), limits.timeout_s)
        except asyncio.TimeoutError:
            return False
        try:
            hello = decode(body) if body is not None else None
        except (ProtocolError, InputError):
            hello = None
        if not isinstance(hello, Hello):
            peer.send(Failed.of(None, ProtocolError("expected a hello")))
            return False
        if not tokens_match(self.token, hello.token):
            peer.send(Failed.of(None, ProtocolError("bad token")))
            return False
        peer.send(Hello(PROTOCOL_VERSION, pid=os.getpid(), status=self._with_pid(self.runner.status)))
        if hello.version != PROTOCOL_VERSION:
            log.warning("client speaks protocol %r, we speak %d", hello.version, PROTOCOL_VERSION)
            return False
        return True

    @staticmethod
    def _with_pid(status: Status) -> Status:
        """The runner's status as this daemon tells it: with its pid."""
        return msgspec.structs.replace(status, engine_pid=os.getpid())

    def _handle(self, peer: _Peer, body: bytes) -> None:
        try:
            message = decode(body)
        except (ProtocolError, InputError) as exc:  # an unknown type, or a request that is not one: it fails alone
            peer.send(Failed.of(envelope(body).id, exc))
            return
        if isinstance(message, Cancel):
            job = peer.jobs.get(message.id)
            if job is not None:
                job.cancel()
        elif isinstance(message, Complete):
            if message.id in peer.jobs:
                peer.send(Failed.of(message.id, InputError("duplicate request id")))
                return
            peer.jobs[message.id] = asyncio.ensure_future(self._complete(peer, message))
        else:
            peer.send(Failed.of(getattr(message, "id", None), ProtocolError(f"a client does not send {envelope(body).type!r}")))

    async def _complete(self, peer: _Peer, message: Complete) -> None:
        """The request's events, forwarded as the engine emits them: Interim..., then Final or Failed."""
        try:
            def early(interim: CompletionResult) -> None:
                peer.send(Interim(message.id, interim))

            result = await self._observed("protocol", message.request, early)
            peer.send(Final(message.id, result))
        except (asyncio.CancelledError, Exception) as exc:  # the request fails alone, with the kind of its error
            peer.send(Failed.of(message.id, exc))
        finally:
            peer.jobs.pop(message.id, None)


def _lock(path: Path) -> int | None:
    """Hold an exclusive flock on `path` for this process's life and write our pid into it."""
    fcntl = unix_only("fcntl")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run_daemon(
    config: EngineConfig,
    socket: Path | None,
    idle_timeout_s: float | None,
    tcp: tuple[str, int] | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    max_batch_requests: int = 16,
    metrics_open: bool = False,
) -> int:
    """Entry point of `kspec engine`; returns the exit code. A Unix-socket daemon holds
    the lock for its model (a second one exits at once); a network daemon needs none:
    its port is its identity, and binding a busy port fails with a clear message."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kspec-engine[%(process)d] %(levelname)s %(message)s")
    lock = None
    if tcp is None:
        paths = DaemonPaths.for_config(config) if socket is None else DaemonPaths(socket, socket.with_suffix(".lock"), socket.with_suffix(".log"))
        lock = _lock(paths.lock)  # before importing torch: a second daemon costs almost nothing
        if lock is None:
            print(f"kspec engine: already running (pid {paths.daemon_pid()}) at {paths.socket}", file=sys.stderr)
            return 0
    try:
        daemon = Daemon(
            replace(config, progress=False), idle_timeout_s=idle_timeout_s, token=token, max_batch_requests=max_batch_requests,
            metrics_open=metrics_open,
        )  # fmt: skip
        if tcp is not None:
            asyncio.run(daemon.serve_tcp(*tcp, tls=tls))
        else:
            asyncio.run(daemon.serve_unix(paths.socket))
    except ValueError as exc:
        raise KspecError(str(exc)) from exc
    except OSError as exc:
        where = f"{tcp[0]}:{tcp[1]}" if tcp is not None else str(paths.socket)
        raise KspecError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    finally:
        if lock is not None:
            os.close(lock)
    return 0
