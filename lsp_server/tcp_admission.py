"""`kspec lsp --tcp`: which connection becomes the server's client.

Any local process can connect to the port. Each connection is screened on its own
thread: its first message must be `initialize` with the token (TokenGate) within
`deadline_s` of connecting, and no bigger than `max_first_bytes`. A connection that says
nothing, something else or the wrong token is answered (when it spoke) and closed; the
server keeps listening. The first connection that shows the token is the client; the
listener and every other pending connection are closed then. At most `max_pending`
connections are screened at once: one more closes the oldest, so connections held open
in silence cannot keep the real client out.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kspec.engine.serve.json_input import JsonInputError, parse_json
from kspec.lsp_server.jsonrpc import UNAUTHORIZED, Body, ChunkReader, Frame, read_frames
from kspec.lsp_server.token_gate import TokenGate

log = logging.getLogger("kspec.lsp")

TOKEN_DEADLINE_S = 5.0  # from connecting to showing the token
MAX_PENDING = 64  # connections screened at once
MAX_FIRST_BYTES = 1 << 20  # the initialize message
ACCEPT_RETRY_S = 1.0  # after accept() failed for lack of descriptors (asyncio waits as long)


@dataclass(frozen=True)
class Admission:
    connection: socket.socket
    frames: Iterator[Frame]  # initialize (without the token), then the rest of the stream


@dataclass(frozen=True)
class Limits:
    deadline_s: float = TOKEN_DEADLINE_S
    max_pending: int = MAX_PENDING
    max_first_bytes: int = MAX_FIRST_BYTES
    max_bytes: int = 128 * 1024 * 1024  # each later message (ServerOptions.max_message_bytes)


def admit(listener: socket.socket, token: str, limits: Limits = Limits()) -> Admission:
    """Blocks until a connection shows the token; closes the listener and the others then."""
    admitted: queue.SimpleQueue[Admission] = queue.SimpleQueue()
    wake_reader, wake_writer = socket.socketpair()
    pending: dict[int, socket.socket] = {}  # by arrival, oldest first
    guard = threading.Lock()
    numbers = itertools.count()
    listener.setblocking(False)
    with selectors.DefaultSelector() as selector, wake_reader, wake_writer:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wake_reader, selectors.EVENT_READ)
        paused_until: float | None = None  # out of descriptors: accept again then
        while admitted.empty():
            if paused_until is not None and time.monotonic() >= paused_until:
                selector.register(listener, selectors.EVENT_READ)
                paused_until = None
            timeout = None if paused_until is None else max(0.0, paused_until - time.monotonic())
            for key, _ in selector.select(timeout):
                if key.fileobj is wake_reader:
                    wake_reader.recv(64)
                    continue
                try:
                    connection, _ = listener.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as exc:  # out of file descriptors: one line a second at most
                    log.warning("cannot accept a connection: %s; retrying in %g s", exc.strerror or exc, ACCEPT_RETRY_S)
                    selector.unregister(listener)
                    paused_until = time.monotonic() + ACCEPT_RETRY_S
                    continue
                number = next(numbers)
                with guard:
                    if len(pending) >= limits.max_pending:
                        _close(pending.pop(next(iter(pending))))  # the oldest: silent squatters cannot keep a client out
                    pending[number] = connection
                threading.Thread(
                    target=_screen, args=(connection, number, token, limits, pending, guard, admitted, wake_writer), name="kspec-lsp-screen", daemon=True
                ).start()
    admission = admitted.get()
    listener.close()
    while not admitted.empty():  # another showed the token in the same moment: one client only
        _close(admitted.get().connection)
    with guard:
        for other in pending.values():
            _close(other)
        pending.clear()
    return admission


def _screen(
    connection: socket.socket, number: int, token: str, limits: Limits, pending: dict[int, socket.socket],
    guard: threading.Lock, admitted: queue.SimpleQueue, wake: socket.socket,
) -> None:  # fmt: skip
    """Reads the first message within the deadline; admits the connection or closes it."""
    ends: list[float] = [time.monotonic() + limits.deadline_s]  # emptied once admitted: no deadline

    def read_chunk(size: int) -> bytes:
        if ends:
            left = ends[0] - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no token within {limits.deadline_s:g} s")
            connection.settimeout(left)
        return connection.recv(size)

    gate = TokenGate(token)
    refusal = "the connection closed before initialize"
    try:
        reader = ChunkReader(read_chunk)
        first = next(read_frames(reader, limits.max_first_bytes), None)
        message = _message(first)
        refusal = gate.refusal(message) if message is not None else "the first message must be an initialize request"
        if refusal is None:
            with guard:
                if pending.pop(number, None) is None:
                    return  # closed meanwhile (too many pending, or another client was admitted)
            ends.clear()
            connection.settimeout(None)
            rest = read_frames(reader, limits.max_bytes)  # the same reader: what it read past initialize comes next
            admitted.put(Admission(connection, itertools.chain([Body(json.dumps(message).encode())], rest)))
            wake.send(b"!")
            return
        log.warning("refusing a connection: %s", refusal)
        _answer(connection, message, refusal)
    except (OSError, ValueError) as exc:  # silent past the deadline, reset, closed by admit()
        log.info("closing a connection that showed no token: %s", exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    with guard:
        if pending.pop(number, None) is not None:
            _close(connection)


def _message(frame: Frame | None) -> dict | None:
    if not isinstance(frame, Body):
        return None
    try:
        data = parse_json(frame.data.decode("utf-8", "replace"))
    except JsonInputError:
        return None
    return data if isinstance(data, dict) else None


def _answer(connection: socket.socket, message: dict | None, refusal: str) -> None:
    msg_id = message.get("id") if message is not None else None
    if not isinstance(msg_id, (int, str)) or isinstance(msg_id, bool):
        msg_id = None
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": UNAUTHORIZED, "message": f"kspec: {refusal}"}}).encode()
    connection.settimeout(1.0)
    connection.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _close(connection: socket.socket) -> None:
    """Wakes its screening thread (blocked in recv) and closes it."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
