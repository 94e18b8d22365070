"""Per-request memos: what a request's prefix and suffix alone determine, computed once.

Decoding asks the early-stop hook every round, interim answers post-process the same
request again, and post-processing itself needs the same window analysis in several places:
each of those pure functions of (prefix, suffix, language) is memoized here, for the last
few requests. `forget_requests` empties them all (a benchmark that times a request as the
first call for its text, as a new keystroke is).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

REQUESTS = 24  # requests remembered per memo: more than a batch decodes together (16), whose interim answers come every round

_F = TypeVar("_F", bound=Callable[..., object])
_MEMOS: list[Callable[..., object]] = []


def request_memo(function: _F) -> _F:
    """Memoize a pure function of a request's immutable arguments (its result does not
    change, or only remembers more behind a lock)."""
    memo = lru_cache(maxsize=REQUESTS)(function)
    _MEMOS.append(memo)
    return memo  # type: ignore[return-value]


def forget_requests() -> None:
    """Empty every per-request memo."""
    for memo in _MEMOS:
        memo.cache_clear()  # type: ignore[attr-defined]
