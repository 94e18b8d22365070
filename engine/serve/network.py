"""Engines on the network: where one is (its URL), whether an address leaves this machine, a free
port to listen on, and the TLS a client verifies it with. TCP is only for an explicit request,
loopback by default, and then a token is required (auth.py)."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

ENGINE_SCHEMES = {"tcp": 0, "tls": 0, "http": 80, "https": 443}  # scheme -> default port (0: required)


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def free_port(host: str) -> int:
    """A TCP port nobody listens on at `host` now (for a server told to pick one)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class EngineUrl:
    """Where a network engine is: tcp:// or tls:// (kspec's msgpack protocol, `kspec
    engine --listen`) or http(s)://HOST:PORT/PATH (an OpenAI-compatible API, e.g. .../v1)."""

    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def secure(self) -> bool:
        return self.scheme in ("tls", "https")

    @property
    def is_http(self) -> bool:
        return self.scheme in ("http", "https")

    @property
    def in_clear_off_machine(self) -> bool:
        """What is sent there (code, the token or API key) crosses a network unencrypted."""
        return not self.secure and not is_loopback(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_engine_url(text: str) -> EngineUrl:
    """Raises ValueError with a message naming what is wrong."""
    from urllib.parse import urlsplit

    parts = urlsplit(text.strip())
    if parts.scheme not in ENGINE_SCHEMES:
        raise ValueError(f"engine URL {text!r} must start with tcp://, tls://, http:// or https://")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"engine URL {text!r}: {exc}") from exc
    port = port or ENGINE_SCHEMES[parts.scheme]
    if not parts.hostname or not port:
        raise ValueError(f"engine URL {text!r} needs a host and a port")
    if parts.scheme in ("tcp", "tls") and parts.path not in ("", "/"):
        raise ValueError(f"engine URL {text!r}: a {parts.scheme}:// URL has no path")
    return EngineUrl(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def client_tls(ca_file: Path | None = None) -> ssl.SSLContext:
    """Verifies the server against the system's CAs, or against `ca_file` (a self-signed
    certificate or a private CA)."""
    import ssl

    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
