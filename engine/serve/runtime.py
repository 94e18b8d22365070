"""Where a user's engine daemons live: a private runtime folder, and per engine configuration a
socket, a lock and a log whose names carry the protocol version and a hash of the engine's
options, so that daemons of other versions or models never answer for this one."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kspec.engine.config import EngineConfig, options
from kspec.engine.serve.wire import PROTOCOL_VERSION


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
    socket: Path  # created 0600 by the daemon, in the 0700 runtime folder
    lock: Path  # held (flock) by the live daemon for its lifetime; holds its pid
    log: Path

    @classmethod
    def for_config(cls, config: EngineConfig, folder: Path | None = None) -> DaemonPaths:
        folder = folder or runtime_dir()
        stem = f"engine-v{PROTOCOL_VERSION}-{daemon_key(config)}"
        return cls(folder / f"{stem}.sock", folder / f"{stem}.lock", folder / f"{stem}.log")

    def daemon_pid(self) -> int | None:
        try:
            text = self.lock.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None
