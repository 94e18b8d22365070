"""JSON from outside the process (LSP messages, HTTP bodies, answers of remote servers).

One parser for all of them, whose every failure is a `JsonInputError` (a ValueError):
Python's `json` raises RecursionError on deep nesting (100,000 `[` kill a caller that
catches ValueError), and values nested near the interpreter's recursion limit break
later code that walks them (validation, repr in logs). So nesting is capped here, once.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # arrays/objects inside each other; LSP and OpenAI messages need under 10


class JsonInputError(ValueError):
    """Not valid JSON, or nested deeper than MAX_DEPTH. `pos` is a character offset when known."""

    def __init__(self, message: str, pos: int | None = None):
        super().__init__(message)
        self.message, self.pos = message, pos


def parse_json(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The value of `text` (UTF-8 when bytes). Raises JsonInputError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonInputError(f"nested more than {max_depth} levels deep") from None
    except json.JSONDecodeError as exc:
        raise JsonInputError(f"{exc.msg} at character {exc.pos}", exc.pos) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise JsonInputError(str(exc)) from None
    if _may_nest(text, max_depth) and _depth(value) > max_depth:
        raise JsonInputError(f"nested more than {max_depth} levels deep")
    return value


def _may_nest(text: str | bytes, max_depth: int) -> bool:
    """Cheap: fewer opening brackets than the limit cannot nest beyond it (brackets in strings count too)."""
    open_array, open_object = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    return text.count(open_array) + text.count(open_object) > max_depth  # type: ignore[arg-type]


def _depth(value: Any) -> int:
    """How many arrays/objects deep `value` goes, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
