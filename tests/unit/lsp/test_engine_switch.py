"""Settings that switch engines: a daemon client closed before it connects
answers EngineUnavailable, never an assertion; in-process engines replaced in a storm
load one at a time, the older load abandoned, and the last one chosen answers."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest

from kspec.engine.api import Completion, CompletionRequest, CompletionResult
from kspec.engine.config import EngineConfig
from kspec.engine.errors import EngineUnavailable
from kspec.engine.serve.load_slot import LoadSlot
from kspec.engine.serve.status import READY, Status
from kspec.lsp_server.engine_client import CLOSED, DaemonEngine, DaemonOptions, InProcessEngine

REQUEST = CompletionRequest(prefix="x = ", suffix="", language="python", deadline_ms=5000)


async def test_a_daemon_client_closed_before_it_connects_answers_unavailable(tmp_path) -> None:
    """Settings switched to `engine: daemon` and back before its client began connecting,
    with a completion in between: was `assert self._connecting is not None` (-32603)."""
    engine = DaemonEngine(DaemonOptions(folder=tmp_path), lambda status: None)
    job = asyncio.ensure_future(engine.complete(REQUEST))
    engine.close()
    await engine.start()  # the start scheduled with it runs after the close
    with pytest.raises(EngineUnavailable, match="closed"):
        await asyncio.wait_for(job, 5)
    assert engine.state == CLOSED
    with pytest.raises(EngineUnavailable):
        await engine.complete(REQUEST)


class Loads:
    """A factory whose loads run until released (reporting progress meanwhile), counting
    how many engines are loading or alive at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.began = threading.Event()
        self.guard = threading.Lock()
        self.alive = 0
        self.most_alive = 0
        self.started: list[str] = []

    def __call__(self, config: EngineConfig, on_progress) -> "Named":
        with self.guard:
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
            self.started.append(config.model or "")
        self.began.set()
        try:
            while not self.release.wait(0.002):
                on_progress(0.5, "loading")  # where a stopped engine's load is abandoned
        except BaseException:
            self.freed()
            raise
        return Named(config.model or "", self)

    def freed(self) -> None:
        with self.guard:
            self.alive -= 1


class Named:
    def __init__(self, name: str, loads: Loads) -> None:
        self.model_name = name
        self._loads = loads

    def __del__(self) -> None:
        self._loads.freed()

    def complete(self, request, cancel=None) -> CompletionResult:
        return CompletionResult([Completion(self.model_name, 0.0)], self.model_name)


async def test_a_storm_of_model_changes_loads_one_engine_at_a_time() -> None:
    loads = Loads()
    slot = LoadSlot()
    statuses: list[Status] = []
    engines: list[InProcessEngine] = []
    for index in range(20):  # each replaces the one before, as Session._ensure_engine does
        if engines:
            engines[-1].close()
        engine = InProcessEngine(replace(EngineConfig(progress=False), model=f"m{index}"), statuses.append, loads, slot)
        engines.append(engine)
        await engine.start()
        if index == 0:
            assert await asyncio.to_thread(loads.began.wait, 10)  # the first load began: the next changes come while it loads
    loads.release.set()
    result = await asyncio.wait_for(engines[-1].complete(REQUEST), 10)
    assert result.model == "m19" and engines[-1].status.state == READY
    assert all([await asyncio.to_thread(engine.join, 10) for engine in engines[:-1]])
    assert loads.most_alive == 1, f"{loads.most_alive} engines loading or alive at once"
    assert loads.started[0] == "m0" and loads.started[-1] == "m19", loads.started  # the others' loads abandoned or never begun
    with pytest.raises(EngineUnavailable):
        await engines[0].complete(REQUEST)
    engines[-1].close()
    assert await asyncio.to_thread(engines[-1].join, 10)
