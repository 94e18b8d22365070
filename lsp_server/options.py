"""How `kspec lsp` was started (`ServerOptions`: what its command line forces over the settings)
and the log filter that keeps message bodies out of pygls' log records."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from kspec.engine.serve.runner import EngineFactory, default_engine_factory
from kspec.lsp_server.engine_client import DAEMON_IDLE_TIMEOUT_S
from kspec.lsp_server.jsonrpc import MAX_MESSAGE_BYTES


class Redactor(logging.Filter):
    """Drops the arguments of pygls' log records (they carry message bodies) unless debugging."""

    def __init__(self, debug: bool = False):
        super().__init__()
        self.debug = debug

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.debug and record.name.startswith("pygls") and record.args:
            hidden = _PLACEHOLDER.sub(lambda match: "%" if match.group() == "%%" else "…", str(record.msg))
            record.msg, record.args = f"{hidden} (arguments hidden; enable debugLog)", ()
        return True


_PLACEHOLDER = re.compile(r"%%|%(\([^)]*\))?[-#0 +]*(\d+|\*)?(\.(\d+|\*))?[diouxXeEfFgGcrsa]")  # printf-style, as logging formats


@dataclass(frozen=True)
class ServerOptions:
    engine: str | None = None  # forces the placement ("inprocess", "daemon", "remote", "openai"); None: the setting decides
    engine_factory: EngineFactory = default_engine_factory  # in-process engines (benchmarks swap it)
    daemon_folder: Path | None = None
    daemon_idle_timeout_s: float = DAEMON_IDLE_TIMEOUT_S
    engine_url: str | None = None  # forces the engine URL (`kspec lsp --engine-url`); None: the setting decides
    daemon_token: str | None = None  # forces the network engine's token
    allow_insecure_remote: bool = False  # `kspec lsp --allow-insecure-remote`: as the setting allowInsecureRemote
    redactor: Redactor = field(default_factory=Redactor)
    max_message_bytes: int = MAX_MESSAGE_BYTES
