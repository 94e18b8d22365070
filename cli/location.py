"""`PATH:LINE:COL` (1-based, like compilers) -> the file's text split at the cursor."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kspec.cli.exits import UsageError
from kspec.engine.errors import InputError

MAX_FILE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileLocation:
    path: Path
    prefix: str
    suffix: str


def parse_location(location: str) -> tuple[Path, int, int]:
    parts = location.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise UsageError(f"expected PATH:LINE:COL (1-based), got {location!r}")
    return Path(parts[0]), int(parts[1]), int(parts[2])


def read_source(path: Path) -> str:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise InputError(f"{path}: file is {size} bytes; the limit is {MAX_FILE_BYTES}")
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise InputError(f"{path}: looks like a binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid UTF-8 (byte {exc.start})") from exc


def split_at(text: str, line: int, column: int, path: Path) -> FileLocation:
    """Line and column are 1-based; the column counts characters and may be one past the line's end."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise InputError(f"{path}: line {line} is outside the file (1..{len(lines)})")
    length = len(lines[line - 1].rstrip("\r"))
    if not 1 <= column <= length + 1:
        raise InputError(f"{path}:{line}: column {column} is outside the line (1..{length + 1})")
    offset = sum(len(current) + 1 for current in lines[: line - 1]) + column - 1
    return FileLocation(path, text[:offset], text[offset:])


def read_location(location: str) -> FileLocation:
    path, line, column = parse_location(location)
    return split_at(read_source(path), line, column, path)
