"""Small JSON files kspec keeps for itself (in its cache folder), read leniently and replaced whole."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

import msgspec

T = TypeVar("T")


def identity_key(identity: dict[str, Any]) -> str:
    """The cache key of everything a measurement depends on (JSON values; others by their str)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when the file is missing, unreadable or holds something else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def replace_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` (see `replace_bytes`). Raises OSError."""
    replace_bytes(path, json.dumps(data).encode())


def replace_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and an atomic rename,
    so a reader (another process) never sees it half written. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class _Stamped(msgspec.Struct, frozen=True):
    at: float  # unix time it was put
    value: msgspec.Raw  # its JSON, decoded by the entries' type on reading


class StampedEntries(Generic[T]):
    """Values of one type (a dataclass or a msgspec Struct) kept by key with the time they were put,
    one JSON file {key: {"at": unix time, "value": ...}}, replaced whole (never half written),
    each value encoded and decoded by msgspec as its type declares (its `__post_init__` checks
    included). A missing, unreadable or foreign file, an entry older than `max_age_s` (or than
    `max_age_of` its value, where given) or one that does not decode as the type is a miss,
    never an error; the newest `entries` are kept."""

    def __init__(self, path: Path, max_age_s: float, entries: int, kind: type[T], max_age_of: Callable[[T], float] | None = None):
        self.path, self.max_age_s, self.entries = path, max_age_s, entries
        self._kind, self._max_age_of = kind, max_age_of

    def _stamped(self) -> dict[str, _Stamped]:
        """The file's well-formed entries; {} for a missing, unreadable or foreign file."""
        try:
            raw = msgspec.json.decode(self.path.read_bytes(), type=dict[str, msgspec.Raw])
        except (OSError, msgspec.DecodeError):
            return {}
        stamped = {}
        for key, entry in raw.items():
            try:
                stamped[key] = msgspec.json.decode(entry, type=_Stamped)
            except msgspec.DecodeError:
                continue
        return stamped

    def get(self, key: str, now: float | None = None) -> T | None:
        """The value put for `key`, or None."""
        entry = self._stamped().get(key)
        now = time.time() if now is None else now
        if entry is None or not 0 <= now - entry.at < self.max_age_s:
            return None
        try:
            value = msgspec.json.decode(entry.value, type=self._kind)
        except msgspec.DecodeError:  # also a value its type's checks refuse (ValidationError)
            return None
        return value if self._max_age_of is None or now - entry.at < self._max_age_of(value) else None

    def put(self, key: str, value: T, now: float | None = None) -> None:
        """Best effort: a file that cannot be written costs a later reader a miss, nothing else."""
        stamped = self._stamped()
        stamped[key] = _Stamped(time.time() if now is None else now, msgspec.Raw(msgspec.json.encode(value)))
        newest = dict(sorted(stamped.items(), key=lambda item: item[1].at)[-self.entries :])
        try:
            replace_bytes(self.path, msgspec.json.encode(newest))
        except OSError:
            pass
