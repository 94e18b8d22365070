"""pygls' log lines carry message bodies in their arguments: hidden unless debugLog, and
the line still reads as a sentence (not a literal `%s [arguments hidden; ...]`)."""

from __future__ import annotations

import logging

from kspec.lsp_server.server import Redactor


def _formatted(redactor: Redactor, msg: str, *args: object) -> str:
    record = logging.LogRecord("pygls.protocol", logging.WARNING, __file__, 1, msg, args, None)
    assert redactor.filter(record)
    return record.getMessage()


def test_hidden_arguments_leave_no_placeholders() -> None:
    redactor = Redactor()
    line = _formatted(redactor, 'Received response to unknown message id "%s" (%d%%, %-5.2f)', "DB_PASSWORD = 'x'", 3, 1.5)
    assert line == 'Received response to unknown message id "…" (…%, …) (arguments hidden; enable debugLog)'


def test_debug_log_keeps_the_arguments() -> None:
    assert _formatted(Redactor(debug=True), "Sending data: %s", "text") == "Sending data: text"
