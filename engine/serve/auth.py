"""The token (API key) a network engine asks of every client: made, read from a file, compared."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from kspec.engine.errors import InputError

log = logging.getLogger("kspec.auth")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def tokens_match(expected: str | None, given: Any) -> bool:
    """Whether `given` is the token (in constant time); anything matches when none is expected."""
    if expected is None:
        return True
    return isinstance(given, str) and secrets.compare_digest(expected, given)


def read_token(path: str | Path) -> str:
    """The token held in a file, for servers and clients alike; `~` is expanded.
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
