"""One engine on one worker thread, driven from asyncio (used in-process and by the daemon).

The worker runs the engine's batcher round after round: requests that arrive while
others are decoding join the batch at the next round (continuous batching, see
engine/batching.py; `max_batch_requests=1` answers them one at a time, in arrival
order). Cancelling the awaiting coroutine sets the request's CancelToken: a request not
started yet is skipped, a running one leaves the batch at its next round. Every request
carries a deadline; time spent waiting counts against it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from kspec.engine.api import CancelToken, CompletionRequest, CompletionResult, Done, EarlyAnswer, admitted
from kspec.engine.errors import EngineUnavailable, KspecError, LoadCancelled
from kspec.engine.serve.freed_memory import IDLE_TRIM_S, return_freed_memory
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
    """For an engine that can only answer whole requests: one request per round."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._waiting: list[tuple[CompletionRequest, CancelToken, Done, float]] = []

    @property
    def idle(self) -> bool:
        return not self._waiting

    def add(self, request: CompletionRequest, cancel: CancelToken, done: Done, early: EarlyAnswer | None = None, arrived: float | None = None) -> None:
        self._waiting.append((request, cancel, done, time.monotonic() if arrived is None else arrived))  # whole requests only: no early answer

    def run_round(self) -> None:
        request, cancel, done, arrived = self._waiting.pop(0)
        try:
            result = self._engine.complete(admitted(request, arrived), cancel)
        except BaseException as exc:  # handed to the waiting coroutine
            done(None, exc)
            return
        done(result, None)

    def cancel_all(self) -> None:
        for _, cancel, _, _ in self._waiting:
            cancel.cancel()


def batcher_for(engine: Engine, max_requests: int) -> Batcher:
    make = getattr(engine, "batcher", None)
    return make(max_requests) if make is not None else SerialBatcher(engine)


ProgressCallback = Callable[[float, str], None]  # (fraction loaded, what is happening)
EngineFactory = Callable[["EngineConfig", ProgressCallback], Engine]


def default_engine_factory(config: "EngineConfig", on_progress: ProgressCallback) -> Engine:
    from kspec.engine.completion import CompletionEngine

    return CompletionEngine.load(config, on_progress)


@dataclass
class _Job:
    request: CompletionRequest
    cancel: CancelToken
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float  # time.monotonic()
    early: EarlyAnswer | None = None  # called on the job's loop


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
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Never a daemon thread, whoever starts it (a thread inherits its starter's daemon flag):
        # the interpreter's exit must wait for it to leave torch's native code (a daemon thread
        # ended there by finalization aborts the process: "terminate called ..."); stop() makes it
        # finish the current decode round and return.
        self._thread = threading.Thread(target=self._work, name="kspec-engine", daemon=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status = Status(LOADING, "loading the model", progress=0.0, model=config.model or "default")
        self._running: set[CancelToken] = set()  # requests handed to the batcher and not settled
        self._stopped = False  # stop() was called: nothing more is queued
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
        with self._guard:  # no job can be queued after the None (complete() checks under the same lock)
            self._stopped = True
            for cancel in self._running:
                cancel.cancel()
            self._queue.put(None)
        if self._slot is not None:
            self._slot.wake()  # a worker waiting for the slot never loads

    def queued(self) -> int:
        """Requests waiting for the engine's thread to take them (the metrics' queue length)."""
        return self._queue.qsize()

    def join(self, timeout_s: float) -> bool:
        """Wait for the worker to finish after stop()."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def complete(self, request: CompletionRequest, early: EarlyAnswer | None = None) -> CompletionResult:
        """The final answer; with `request.first_answer_ms` > 0, `early(result)` may be called
        (on this loop) with an interim one first, while decoding goes on."""
        loop = asyncio.get_running_loop()
        job = _Job(request, CancelToken(), loop.create_future(), loop, time.monotonic(), early)
        with self._guard:
            if self._stopped:
                raise EngineUnavailable(STOPPED)
            self._queue.put(job)
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
        batcher = batcher_for(engine, self.max_batch_requests) if engine is not None else None
        stopping = False  # once stop() was seen (alone or among jobs), for good
        while True:
            for job in self._arrivals(block=not stopping and (batcher is None or batcher.idle)):
                if job is None:
                    stopping = True
                elif stopping:
                    _resolve(job, None, EngineUnavailable(STOPPED))
                elif not (job.cancel.cancelled or job.future.done()):
                    self._submit(job, batcher)
            if stopping and batcher is not None:
                batcher.cancel_all()  # each request ends at its next round
            if batcher is not None and not batcher.idle:
                try:
                    batcher.run_round()
                except Exception:  # a bug must not kill the worker: the requests fail, the engine stays
                    log.exception("a decode round failed")
                    batcher.cancel_all()
            elif stopping:
                return

    def _arrivals(self, block: bool) -> list[_Job | None]:
        """The jobs queued since the last round; waits for one when there is no work (after
        `IDLE_TRIM_S` of waiting, the memory the last requests freed goes back to the system)."""
        jobs: list[_Job | None] = []
        try:
            jobs.append(self._next_job() if block else self._queue.get_nowait())
            while True:
                jobs.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return jobs

    def _next_job(self) -> _Job | None:
        try:
            return self._queue.get(timeout=IDLE_TRIM_S)
        except queue.Empty:
            return_freed_memory()
            return self._queue.get()

    def _submit(self, job: _Job, batcher: Batcher | None) -> None:
        if batcher is None:
            _resolve(job, None, EngineUnavailable(self.status.message))
            return
        with self._guard:
            self._running.add(job.cancel)
        early = (lambda result: _call_soon(job, job.early, result)) if job.early is not None else None  # type: ignore[arg-type]
        # The batcher admits it and owns its deadline, counted from its arrival here
        batcher.add(job.request, job.cancel, lambda result, error: self._settle(job, result, error), early, arrived=job.arrived)

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
