"""The engine daemon's wire protocol: length-prefixed msgpack frames.

A frame is a 4-byte big-endian length and a msgpack map with a "type": after the hello
{version, token} / {version, pid, status}, the typed messages of messages.py (complete,
cancel; early, result, error, status), encoded and decoded there only. Frames over
`MAX_FRAME` are a protocol error on either side and close the connection.

The socket lives in the user's runtime directory (0700) and is created 0600; its name
carries the protocol version and a hash of the engine settings, so daemons of other
versions or models never answer for this one. TCP is only for an explicit request,
loopback by default, and then a token is required.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import os
import secrets
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from kspec.engine.config import EngineConfig, options
from kspec.engine.errors import InputError, ProtocolError

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("kspec.protocol")

PROTOCOL_VERSION = 1
MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


def pack(message: dict[str, Any]) -> bytes:
    try:
        body = msgpack.packb(message, use_bin_type=True)
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" in JSON) in some text
        raise InputError(f"text that is not valid Unicode cannot be sent (a lone surrogate at character {exc.start})") from None
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _HEADER.pack(len(body)) + body


def unpack(body: bytes) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed frame: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a frame must be a map with a 'type'")
    return message


async def read_frame(reader: asyncio.StreamReader, header: bytes | None = None, limit: int | None = None) -> dict[str, Any] | None:
    """The next message, or None at a clean end of stream. `header`: its first 4 bytes,
    when the caller has already read them (to tell the protocol from HTTP); `limit`: a
    smaller size limit than MAX_FRAME (a hello, before the token is verified)."""
    if header is None:
        try:
            header = await reader.readexactly(_HEADER.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise ProtocolError("stream ended inside a frame header") from exc
            return None
    (size,) = _HEADER.unpack(header)
    limit = MAX_FRAME if limit is None else min(limit, MAX_FRAME)
    if size > limit:
        raise ProtocolError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("stream ended inside a frame") from exc
    return unpack(body)


def write_frame(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(pack(message))


# --- where daemons live ------------------------------------------------------------


def runtime_dir() -> Path:
    """$XDG_RUNTIME_DIR/kspec, else a private per-user folder in the temp dir; 0700 and ours."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "kspec" if base and Path(base).is_dir() else Path(tempfile.gettempdir()) / f"kspec-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{folder} is not a directory owned by this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        folder.chmod(0o700)
    return folder


def daemon_key(config: EngineConfig) -> str:
    """Daemons are shared between editors whose engines are configured alike: a hash of
    the protocol version and every engine option (paths resolved, so a folder named two
    ways is one daemon)."""
    from kspec.engine.models.catalog import default_model_spec

    values = []
    for option_field in options():
        value = getattr(config, option_field.name)
        if option_field.name == "model" and not value:  # the default is $KSPEC_MODEL's or kspec's: the key names which
            value = default_model_spec()
        if option_field.metadata["path"] and value and Path(value).expanduser().exists():
            value = str(Path(value).expanduser().resolve())
        values.append([option_field.name, value])
    data = json.dumps([PROTOCOL_VERSION, values])
    return hashlib.sha256(data.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DaemonPaths:
    socket: Path
    lock: Path  # held (flock) by the live daemon for its lifetime; holds its pid
    log: Path

    @classmethod
    def for_config(cls, config: EngineConfig, folder: Path | None = None) -> "DaemonPaths":
        folder = folder or runtime_dir()
        stem = f"engine-v{PROTOCOL_VERSION}-{daemon_key(config)}"
        return cls(folder / f"{stem}.sock", folder / f"{stem}.lock", folder / f"{stem}.log")

    def daemon_pid(self) -> int | None:
        try:
            text = self.lock.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None


def new_token() -> str:
    return secrets.token_urlsafe(24)


def tokens_match(expected: str | None, given: Any) -> bool:
    if expected is None:
        return True
    return isinstance(given, str) and secrets.compare_digest(expected, given)


def free_port(host: str) -> int:
    """A TCP port nobody listens on at `host` now (for a server told to pick one)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def read_token(path: str | Path) -> str:
    """The token (API key) held in a file, for servers and clients alike; `~` is expanded.
    Raises InputError when the file cannot be read or holds nothing."""
    path = Path(path).expanduser()
    try:
        with open(path) as handle:
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
            token = handle.read().strip()
    except OSError as exc:
        raise InputError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise InputError(f"the token file {path} is empty")
    if mode & 0o077:
        log.warning("the token file %s can be read by other users (mode %o): run chmod 600 %s", path, mode, path)
    return token


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


# --- engines on the network ----------------------------------------------------------

ENGINE_SCHEMES = {"tcp": 0, "tls": 0, "http": 80, "https": 443}  # scheme -> default port (0: required)


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


def client_tls(ca_file: Path | None = None) -> "ssl.SSLContext":
    """Verifies the server against the system's CAs, or against `ca_file` (a self-signed
    certificate or a private CA)."""
    import ssl

    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
