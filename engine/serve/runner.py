"""One engine on one worker thread, driven from asyncio (used in-process and by the daemon).

The worker runs the engine's batcher round after round: requests that arrive while
others are decoding join the batch at the next round (continuous batching, see
engine/batching.py; `max_batch_requests=1` answers them one at a time, in arrival
order). A request waits in one queue only, the batcher's `WaitingLine`: `complete` puts it
there from the event loop, and the worker takes from it at each round (or waits on it when
there is no work). Cancelling the awaiting coroutine sets the request's CancelToken: a request not
started yet is skipped, a running one leaves the batch at its next round. Every request
carries a deadline; time spent waiting counts against it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from kspec.engine.api import CancelToken, CompletionRequest, CompletionResult, Done, EarlyAnswer, admitted
from kspec.engine.waiting_line import Waiting, WaitingLine
from kspec.engine.errors import CancelledError
from kspec.engine.errors import EngineUnavailable, KspecError, LoadCancelled
from kspec.engine.freed_memory import IDLE_TRIM_S, return_freed_memory
from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.main_exit import stop_at_main_exit
from kspec.engine.serve.status import ERROR, LOADING, READY, Status

if TYPE_CHECKING:
    from kspec.engine.config import EngineConfig

log = logging.getLogger("kspec.engine")

STOPPED = "the engine was stopped (its settings changed, or the server is exiting)"

class Engine(Protocol):
    @property
    def model_name(self) -> str: ...

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult: ...


class Batcher(Protocol):
    """Requests in, rounds run on the worker thread (kspec.engine.batching.ContinuousBatcher)."""

    @property
    def idle(self) -> bool: ...

    def add(self, request: CompletionRequest, cancel: CancelToken, done: Done, early: EarlyAnswer | None = None, arrived: float | None = None) -> None: ...

    def run_round(self) -> None: ...

    def cancel_all(self) -> None: ...


class SerialBatcher:
    """For an engine that can only answer whole requests: one request per round (no early answer)."""

    def __init__(self, engine: Engine, waiting: WaitingLine | None = None):
        self._engine = engine
        self._waiting = WaitingLine() if waiting is None else waiting

    @property
    def idle(self) -> bool:
        return not len(self._waiting)

    def add(self, request: CompletionRequest, cancel: CancelToken, done: Done, early: EarlyAnswer | None = None, arrived: float | None = None) -> None:
        self._waiting.put(Waiting(request, cancel, done, None, time.monotonic() if arrived is None else arrived))

    def run_round(self) -> None:
        waiting = self._waiting.take()
        if waiting is None:
            return
        request, cancel, done, _, arrived = waiting
        if cancel.cancelled:  # its caller stopped waiting before its turn: never run
            done(None, CancelledError("cancelled before it started"))
            return
        try:
            result = self._engine.complete(admitted(request, arrived), cancel)
        except BaseException as exc:  # handed to the waiting coroutine
            done(None, exc)
            return
        done(result, None)

    def cancel_all(self) -> None:
        self._waiting.cancel_all()


def batcher_for(engine: Engine, max_requests: int, waiting: WaitingLine) -> Batcher:
    make = getattr(engine, "batcher", None)
    return make(max_requests, waiting) if make is not None else SerialBatcher(engine, waiting)


ProgressCallback = Callable[[float, str], None]  # (fraction loaded, what is happening)
EngineFactory = Callable[["EngineConfig", ProgressCallback], Engine]


def default_engine_factory(config: "EngineConfig", on_progress: ProgressCallback) -> Engine:
    """The engine, loaded, with Python's cyclic collector off meanwhile: the first load imports torch
    and kspec's engine, ~1M objects that live as long as the process, and full collections scanned
    them again and again (~0.1 s of a start). Once imported they are frozen out of every later
    collection, so the load's own one (engine/models/loading.py) scans only what the load made."""
    first = "kspec.engine.completion" not in sys.modules
    collecting = gc.isenabled()
    gc.disable()
    try:
        from kspec.engine.completion import CompletionEngine

        if first:
            gc.freeze()
        return CompletionEngine.load(config, on_progress)
    finally:
        if collecting:
            gc.enable()


@dataclass
class _Job:
    """The awaiting side of a request: where its answers are handed back."""

    cancel: CancelToken
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def _call_soon(job: _Job, callback: EarlyAnswer, result: CompletionResult) -> None:
    """An early answer, handed to the waiting side's loop (unless it stopped waiting)."""
    if job.future.done():
        return
    try:
        job.loop.call_soon_threadsafe(callback, result)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


def _resolve(job: _Job, result: CompletionResult | None, error: BaseException | None) -> None:
    def settle() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


class EngineRunner:
    def __init__(
        self,
        config: "EngineConfig",
        factory: EngineFactory,
        on_status: Callable[[Status], None],
        max_batch_requests: int = 16,
        slot: LoadSlot | None = None,  # shared by the engines of one owner: one loads (or lives) at a time
    ):
        self.config = config
        self._slot = slot
        self.max_batch_requests = max_batch_requests
        self._factory = factory
        self._on_status = on_status
        self._waiting = WaitingLine()  # the one queue: requests in arrival order, until the batch takes them
        # Never a daemon thread, whoever starts it (a thread inherits its starter's daemon flag):
        # the interpreter's exit must wait for it to leave torch's native code (a daemon thread
        # ended there by finalization aborts the process: "terminate called ..."); stop() makes it
        # finish the current decode round and return.
        self._thread = threading.Thread(target=self._work, name="kspec-engine", daemon=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status = Status(LOADING, "loading the model", progress=0.0, model=config.model or "default")
        self._running: set[CancelToken] = set()  # requests handed to the batcher and not settled
        self._stopped = False  # stop() was called: nothing more is queued (the line is closed)
        self._guard = threading.Lock()  # guards _status/_running/_stopped between threads; never held across an await

    @property
    def status(self) -> Status:
        with self._guard:
            return self._status

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        # When the main thread ends, stop the worker before the interpreter joins it (atexit
        # would run only after that join): an owner that never called stop(), e.g. after an
        # exception, must not hang the process at exit.
        stop_at_main_exit(self)

    def stop(self) -> None:
        """Cancels the running requests (each stops at its next round) and ends the thread (without waiting)."""
        with self._guard:  # no request can be queued after this (complete() checks under the same lock)
            self._stopped = True
            for cancel in self._running:
                cancel.cancel()
            self._waiting.close()
        if self._slot is not None:
            self._slot.wake()  # a worker waiting for the slot never loads

    def queued(self) -> int:
        """Requests waiting for a place in the batch (the metrics' queue length)."""
        return len(self._waiting)

    def join(self, timeout_s: float) -> bool:
        """Wait for the worker to finish after stop()."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        """The final answer; with `request.first_answer_ms` > 0, `early(result)` may be called
        (on this loop) with an interim one first, while decoding goes on."""
        loop = asyncio.get_running_loop()
        job = _Job(CancelToken(), loop.create_future(), loop)
        forward = (lambda result: _call_soon(job, early, result)) if early is not None else None  # type: ignore[arg-type]
        # The batcher admits it and owns its deadline, counted from its arrival here
        waiting = Waiting(request, job.cancel, lambda result, error: self._settle(job, result, error), forward, time.monotonic())
        with self._guard:
            if self._stopped:
                raise EngineUnavailable(STOPPED)
            self._running.add(job.cancel)
            self._waiting.put(waiting)
        try:
            return await job.future
        finally:
            job.cancel.cancel()  # no-op when finished; stops it when we were cancelled

    def _set_status(self, status: Status) -> None:
        with self._guard:
            self._status = status
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_status, status)
            except RuntimeError:
                pass

    def _stopping(self) -> bool:
        with self._guard:
            return self._stopped

    def _work(self) -> None:
        if self._slot is None:
            self._serve()
        elif self._slot.take(self._stopping):
            try:
                self._serve()
            finally:
                gc.collect()  # the engine (and any cycle through it) is freed before the next one loads
                self._slot.give_back()
        else:
            self._serve(load=False)  # stopped before its turn: answers the queued jobs, loads nothing

    def _serve(self, load: bool = True) -> None:
        engine = self._load() if load else None
        if engine is None:  # not loaded: every request fails, until stop()
            while not self._waiting.closed or len(self._waiting):
                while (waiting := self._waiting.take()) is not None:
                    waiting.done(None, EngineUnavailable(STOPPED if self._stopping() else self.status.message))
                self._waiting.wait()
            return
        batcher = batcher_for(engine, self.max_batch_requests, self._waiting)
        while True:
            stopping = self._waiting.closed  # for good: stop() was called
            if stopping:
                while (waiting := self._waiting.take()) is not None:  # not started: never will be
                    waiting.done(None, EngineUnavailable(STOPPED))
                batcher.cancel_all()  # each running request ends at its next round
            if not batcher.idle:
                try:
                    batcher.run_round()
                except Exception:  # a bug must not kill the worker: the requests fail, the engine stays
                    log.exception("a decode round failed")
                    batcher.cancel_all()
            elif stopping:
                return
            elif not self._waiting.wait(IDLE_TRIM_S):  # nothing to do for a while: the memory the last requests freed goes back
                return_freed_memory()
                self._waiting.wait()

    def _settle(self, job: _Job, result: CompletionResult | None, error: BaseException | None) -> None:
        with self._guard:
            self._running.discard(job.cancel)
        if error is not None and not isinstance(error, KspecError):
            log.error("engine failed on a request: %s: %s", type(error).__name__, error)
            error = EngineUnavailable(f"engine error: {type(error).__name__}: {error}")
        _resolve(job, result, error)

    def _report_loading(self, fraction: float, message: str) -> None:
        if self._stopping():
            raise LoadCancelled("the model's settings changed while it loaded")  # unwinds the loader, freeing what it allocated
        self._set_status(Status(LOADING, message, progress=round(fraction, 3), model=self.config.model or "default"))

    def _load(self) -> Engine | None:
        started = time.perf_counter()
        self._set_status(Status(LOADING, "loading the model", progress=0.0, model=self.config.model or "default"))
        try:
            if self._stopping():
                raise LoadCancelled("stopped before loading")
            engine = self._factory(self.config, self._report_loading)
        except Exception as exc:
            if self._stopping() or isinstance(exc, LoadCancelled):  # a loader may wrap LoadCancelled in its own error
                log.info("loading %s abandoned: its engine was stopped", self.config.model or "the default model")
                return None
            return self._failed(exc)
        log.info("model %s loaded in %.1f s", engine.model_name, time.perf_counter() - started)
        return_freed_memory()  # the loader's conversion buffers
        fitted = getattr(engine, "defaults", None)  # MachineDefaults, for engines that time themselves
        attention = getattr(engine, "attention", None)  # the attention paths the model takes (kernels/paths.py)
        self._set_status(Status(
            READY, "ready", progress=1.0, model=engine.model_name, defaults=fitted.to_dict() if fitted else None, attention=attention,
            kernels=getattr(engine, "kernels", ""),
        ))
        return engine

    def _failed(self, exc: Exception) -> None:
        if not isinstance(exc, KspecError):
            log.exception("loading the model failed", exc_info=exc)
        reason = str(exc) if isinstance(exc, KspecError) else f"{type(exc).__name__}: {exc}"
        self._set_status(Status(ERROR, f"cannot load the model: {reason}", model=self.config.model or "default"))
        return None
