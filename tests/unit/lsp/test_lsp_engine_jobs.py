"""An engine job whose request stopped waiting (superseded, or the engine closed at shutdown)
may still end in an error: it must not be logged as "Task exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from kspec.engine.errors import EngineUnavailable
from kspec.lsp_server.completion_flow import _retrieved


def _unretrieved_reports(mark_retrieved: bool) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, context: reports.append(context))

    async def closed_engine() -> None:
        raise EngineUnavailable("the engine client was closed")

    async def run() -> None:
        job = asyncio.ensure_future(closed_engine())
        if mark_retrieved:
            job.add_done_callback(_retrieved)
        await asyncio.wait({job})  # done, its error never read

    loop.run_until_complete(run())
    loop.close()
    gc.collect()
    return [r for r in reports if "never retrieved" in str(r.get("message", ""))]


def test_an_error_nobody_waited_for_is_not_reported() -> None:
    assert _unretrieved_reports(mark_retrieved=True) == []


def test_without_it_asyncio_reports_the_error() -> None:
    """The check above can fail: the same job, unmarked, is reported."""
    assert len(_unretrieved_reports(mark_retrieved=False)) == 1
