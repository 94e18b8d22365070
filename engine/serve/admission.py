"""What a network engine grants a connection before its token is verified.

Until a connection has shown the token (a msgpack hello, or an HTTP request head with
`Authorization: Bearer`) it gets a small budget: PREAUTH_BYTES for the hello frame or
the request head (no HTTP body is read before the token is checked), PREAUTH_TIMEOUT_S
to present it whole, and a place among at most PREAUTH_CONNECTIONS such connections.
When a new one arrives with every place taken, the oldest waiting one is dropped: a
flood of silent or slow connections costs a bounded amount of memory and descriptors,
and a real client, which presents its token at once, still gets in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

log = logging.getLogger("kspec.daemon")

PREAUTH_CONNECTIONS = 32
PREAUTH_BYTES = 64 * 1024
PREAUTH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AdmissionLimits:
    connections: int = PREAUTH_CONNECTIONS
    bytes: int = PREAUTH_BYTES
    timeout_s: float = PREAUTH_TIMEOUT_S


class Admission:
    """The connections that have not shown their token yet, oldest first."""

    def __init__(self, limits: AdmissionLimits = AdmissionLimits()):
        self.limits = limits
        self._waiting: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self.dropped = 0  # connections dropped to make room

    def __len__(self) -> int:
        return len(self._waiting)

    def arrive(self, writer: asyncio.StreamWriter) -> None:
        self._waiting[writer] = None
        while len(self._waiting) > self.limits.connections:
            oldest, _ = self._waiting.popitem(last=False)
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:  # a flood logs a line now and then, not per connection
                log.warning("over %d connections without a token: dropping the oldest (%d so far)", self.limits.connections, self.dropped)
            oldest.transport.abort()

    def authenticated(self, writer: asyncio.StreamWriter) -> None:
        self._waiting.pop(writer, None)

    def leave(self, writer: asyncio.StreamWriter) -> None:
        self._waiting.pop(writer, None)
