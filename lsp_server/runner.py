"""One engine on one worker thread, driven from asyncio (used in-process and by the daemon).

The engine answers one request at a time (it is CPU/GPU bound), so requests queue in
arrival order. Cancelling the awaiting coroutine sets the request's CancelToken: a
request not started yet is skipped, a running one stops at its next decode round.
Every request carries a deadline; time spent in the queue counts against it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Protocol

from engine.api import CancelToken, CompletionRequest, CompletionResult
from engine.errors import KspecError

if TYPE_CHECKING:
    from engine.config import EngineConfig

log = logging.getLogger("kspec.engine")

LOADING, READY, ERROR = "loading", "ready", "error"


class EngineUnavailable(KspecError):
    """No engine to answer: it failed to load, or the daemon is gone."""


class DeadlineExceeded(KspecError):
    """The request's deadline passed before the engine could start it."""


class Engine(Protocol):
    @property
    def model_name(self) -> str: ...

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult: ...


ProgressCallback = Callable[[float, str], None]  # (fraction loaded, what is happening)
EngineFactory = Callable[["EngineConfig", ProgressCallback], Engine]


def default_engine_factory(config: "EngineConfig", on_progress: ProgressCallback) -> Engine:
    from engine.completion import CompletionEngine

    return CompletionEngine.load(config, on_progress)


@dataclass(frozen=True)
class Status:
    state: str  # LOADING, READY or ERROR
    message: str = ""
    progress: float | None = None  # 0..1 while loading
    model: str = ""
    latency_ms: float | None = None  # of the last answered request
    engine_pid: int | None = None  # the daemon's pid, when there is one

    def to_dict(self) -> dict:
        data = {"state": self.state, "message": self.message, "model": self.model}
        if self.progress is not None:
            data["progress"] = self.progress
        if self.latency_ms is not None:
            data["latencyMs"] = round(self.latency_ms, 1)
        if self.engine_pid is not None:
            data["enginePid"] = self.engine_pid
        return data


@dataclass
class _Job:
    request: CompletionRequest
    cancel: CancelToken
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic()


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
    def __init__(self, config: "EngineConfig", factory: EngineFactory, on_status: Callable[[Status], None]):
        self.config = config
        self._factory = factory
        self._on_status = on_status
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Not a daemon thread: the interpreter must not exit while it runs torch code (that
        # aborts the process); stop() makes it finish the current decode round and return.
        self._thread = threading.Thread(target=self._work, name="kspec-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status = Status(LOADING, "loading the model", progress=0.0, model=config.model or "default")
        self._current: CancelToken | None = None
        self._guard = threading.Lock()  # guards _status/_current between threads; never held across an await

    @property
    def status(self) -> Status:
        with self._guard:
            return self._status

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        # At interpreter exit, stop the worker before threading joins it (the hook
        # concurrent.futures uses for its own workers): an owner that never called stop(),
        # e.g. after an exception, must not hang the process at exit.
        threading._register_atexit(self.stop)  # type: ignore[attr-defined]

    def stop(self) -> None:
        """Stops the running request at its next round and ends the thread (without waiting)."""
        with self._guard:
            if self._current is not None:
                self._current.cancel()
        self._queue.put(None)

    def join(self, timeout_s: float) -> bool:
        """Wait for the worker to finish after stop()."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def complete(self, request: CompletionRequest) -> CompletionResult:
        loop = asyncio.get_running_loop()
        job = _Job(request, CancelToken(), loop.create_future(), loop, time.monotonic() + request.deadline_ms / 1000)
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

    def _work(self) -> None:
        engine = self._load()
        while (job := self._queue.get()) is not None:
            if job.cancel.cancelled or job.future.done():
                continue
            if engine is None:
                _resolve(job, None, EngineUnavailable(self.status.message))
                continue
            remaining_ms = (job.deadline - time.monotonic()) * 1000
            if remaining_ms <= 1:
                _resolve(job, None, DeadlineExceeded("the deadline passed while waiting for the engine"))
                continue
            with self._guard:
                self._current = job.cancel
            try:
                _resolve(job, engine.complete(replace(job.request, deadline_ms=remaining_ms), job.cancel), None)
            except KspecError as exc:
                _resolve(job, None, exc)
            except Exception as exc:  # a bug in the engine must not kill the worker
                log.exception("engine failed on a request")
                _resolve(job, None, EngineUnavailable(f"engine error: {type(exc).__name__}: {exc}"))
            finally:
                with self._guard:
                    self._current = None

    def _report_loading(self, fraction: float, message: str) -> None:
        self._set_status(Status(LOADING, message, progress=round(fraction, 3), model=self.config.model or "default"))

    def _load(self) -> Engine | None:
        started = time.perf_counter()
        self._set_status(Status(LOADING, "loading the model", progress=0.0, model=self.config.model or "default"))
        try:
            engine = self._factory(self.config, self._report_loading)
        except KspecError as exc:
            self._set_status(Status(ERROR, f"cannot load the model: {exc}", model=self.config.model or "default"))
            return None
        except Exception as exc:
            log.exception("loading the model failed")
            self._set_status(Status(ERROR, f"cannot load the model: {type(exc).__name__}: {exc}", model=self.config.model or "default"))
            return None
        log.info("model %s loaded in %.1f s", engine.model_name, time.perf_counter() - started)
        self._set_status(Status(READY, "ready", progress=1.0, model=engine.model_name))
        return engine
