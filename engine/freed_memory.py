"""Giving the memory a finished request freed back to the system.

glibc keeps what `free` returns in its heap for the next allocation: a request's transient
tensors (a round's logits over the vocabulary for every verified row, the load's conversion
buffers, the kernel trial's candidates, a large HTTP body) stay in the process's resident memory
after they are freed. `malloc_trim` hands the
free pages back. It costs a few milliseconds (0.5B model: ~3 ms for a ~600 MB process), so the
engine calls it once after loading and once whenever it has been idle for `IDLE_TRIM_S`, never
between the keystrokes of a burst. Other C libraries (musl, macOS, Windows): nothing to do here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Callable

IDLE_TRIM_S = 1.0  # idle this long after a request before the freed memory goes back


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_freed_memory() -> bool:
    """Hands the C heap's free pages back to the system; False where the C library has no way to."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
