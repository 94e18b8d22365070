"""Under fd exhaustion asyncio reports every failed accept() with a traceback (a
burst of 80); the daemon's loop says it once per burst, with the count."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from kspec.engine.serve.loop_errors import RESOURCE_MESSAGE, ResourceErrors


def test_a_burst_of_failed_accepts_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(ResourceErrors())
        with caplog.at_level(logging.WARNING):
            for _ in range(80):
                loop.call_exception_handler({"message": RESOURCE_MESSAGE, "exception": OSError(errno.EMFILE, "Too many open files")})
            loop.call_exception_handler({"message": "something else", "exception": ValueError("kept")})
    finally:
        loop.close()
    lines = [r for r in caplog.records if "accept" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "Too many open files" in lines[0].getMessage() and "ulimit" in lines[0].getMessage()
    assert any("something else" in r.getMessage() and r.exc_info for r in caplog.records)  # other errors as asyncio reports them
