"""Small JSON files kspec keeps for itself (in its cache folder), read leniently and replaced whole."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

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
    """Write `data` to `path` through a temporary file in the same folder and an atomic rename,
    so a reader (another process) never sees it half written. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(data, handle)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class StampedEntries(Generic[T]):
    """Values kept by key with the time they were put, one JSON file {key: {"at": unix time,
    "value": ...}}, replaced whole (never half written), each value through `encode` / `decode`
    (which raises ValueError for what is not one). A missing, unreadable or foreign file, an entry
    older than `max_age_s` (or than `max_age_of` its value, where given) or one that does not decode
    is a miss, never an error; the newest `entries` are kept."""

    def __init__(
        self, path: Path, max_age_s: float, entries: int, decode: Callable[[Any], T], encode: Callable[[T], Any],
        max_age_of: Callable[[T], float] | None = None,
    ):  # fmt: skip
        self.path, self.max_age_s, self.entries = path, max_age_s, entries
        self._decode, self._encode, self._max_age_of = decode, encode, max_age_of

    def get(self, key: str, now: float | None = None) -> T | None:
        """The value put for `key`, or None."""
        entry = read_json_object(self.path).get(key)
        now = time.time() if now is None else now
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)) or not 0 <= now - entry["at"] < self.max_age_s:
            return None
        try:
            value = None if entry.get("value") is None else self._decode(entry["value"])
        except ValueError:
            return None
        return value if value is None or self._max_age_of is None or now - entry["at"] < self._max_age_of(value) else None

    def put(self, key: str, value: T, now: float | None = None) -> None:
        """Best effort: a file that cannot be written costs a later reader a miss, nothing else."""
        stamped = {k: e for k, e in read_json_object(self.path).items() if isinstance(e, dict) and isinstance(e.get("at"), (int, float))}
        stamped[key] = {"at": time.time() if now is None else now, "value": self._encode(value)}
        newest = dict(sorted(stamped.items(), key=lambda item: item[1]["at"])[-self.entries :])
        try:
            replace_json(self.path, newest)
        except OSError:
            pass
