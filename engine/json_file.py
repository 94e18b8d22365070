"""Small JSON files kspec keeps for itself (in its cache folder), read leniently and replaced whole."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


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
