"""Every decoder layer of a branch step in one C++ call (``csrc/branch_layers.cpp``: what it
computes and why), built for this machine at first use.

``load(cache_dir)`` compiles the source with ``torch.utils.cpp_extension`` and this machine's C++
compiler (``-O3 -march=native``; ~8 s once, then found in the cache folder, rebuilt when the
source or PyTorch changes) and returns the op, or None where it cannot be built (no compiler,
no int4 kernel in this PyTorch); ``unavailable_reason()`` says why. Callers fall back to
PyTorch ops then. ``build_folder()`` is per CPU model and flag set, so a cache folder shared
between machines never hands one CPU's instructions to another.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path
from typing import Callable

import torch

__all__ = ["load", "unavailable_reason", "build_folder", "SOURCE"]

SOURCE = Path(__file__).with_name("csrc") / "branch_layers.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp"]  # -fopenmp: at::parallel_for runs on one thread without it


def build_folder(cache_dir: Path) -> Path:
    """Where the built library lives under kspec's cache folder: per torch version and CPU."""
    return cache_dir / "native" / f"torch-{torch.__version__}-{_cpu_tag()}"


def _cpu_tag() -> str:
    text = platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
        text += "".join(line for line in info.splitlines() if line.startswith(("model name", "flags")))[:8192]
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=None)
def _built(cache_dir: Path) -> tuple[Callable[..., torch.Tensor] | None, str]:
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return None, "this PyTorch has no int4 CPU kernel"
    try:
        from torch.utils.cpp_extension import load as build

        folder = build_folder(cache_dir)
        folder.mkdir(parents=True, exist_ok=True)
        build("kspec_branch_layers", [str(SOURCE)], extra_cflags=FLAGS, build_directory=str(folder),
              is_python_module=False, verbose=False)  # fmt: skip
        return torch.ops.kspec.branch_layers, ""
    except Exception as exc:  # no compiler, headers or ninja: the PyTorch ops serve instead
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"the C++ layer loop could not be built ({first_line[:300]})"


def load(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.branch_layers``, built under ``cache_dir`` if needed (kspec's cache
    folder: engine/models/resolve.py ``cache_root``); None where it cannot be."""
    return _built(cache_dir)[0]


def unavailable_reason(cache_dir: Path, tried_only: bool = False) -> str:
    """Why ``load(cache_dir)`` gives None ('' when it does not; with tried_only, also '' when
    this process has not asked for the loop yet, so that asking builds nothing)."""
    if tried_only and _built.cache_info().currsize == 0:
        return ""
    return _built(cache_dir)[1]
