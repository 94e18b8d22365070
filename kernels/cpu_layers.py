"""kspec's C++ CPU ops, built for this machine at first use: every decoder layer of a branch step
in one call (``csrc/branch_layers.cpp``: what it computes and why) and the 4-bit x 8-bit matmul
it and the fast path's projections use on AVX2 and AVX-512 VNNI CPUs (``csrc/q4_q8_matmul.cpp``).

``load(cache_dir)`` compiles the sources with ``torch.utils.cpp_extension`` and this machine's C++
compiler (``-O3 -march=native``; ~8 s once, then found in the cache folder, rebuilt when the
sources or PyTorch change) and returns the layer loop, ``load_matmul(cache_dir)`` the matmul;
None where they cannot be built (no compiler, no int4 kernel in this PyTorch);
``unavailable_reason()`` says why. Callers fall back to
PyTorch ops then. ``build_folder()`` is per CPU model and flag set, so a cache folder shared
between machines never hands one CPU's instructions to another.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Callable

import torch

from kspec.kernels.cpu_cap import cpu_cap

__all__ = ["load", "load_attention", "load_matmul", "load_q8_matmul", "load_q5_matmul", "matmul_isa", "matmul_amx_rows", "unavailable_reason", "build_folder", "cpu_info", "SOURCES"]

SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("branch_layers.cpp", "q4_q8_matmul.cpp"))
# -fopenmp: at::parallel_for runs on one thread without it. -fno-trapping-math: no code here reads
# floating-point exception flags, and without it GCC keeps every loop with a float select scalar
# on AVX2 (the exponentials of SiLU and the attention's softmax: "control flow in loop"); the
# values computed are the same
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math"]
# Builds for another instruction set than this CPU's best: `KSPEC_MARCH=haswell` (AVX2) or
# `x86-64` (the generic loops) runs those loops on any newer CPU, so the tests check every ISA's
# code on whatever machine they run on (tests/kernels/test_other_isas.py)
MARCH_VARIABLE = "KSPEC_MARCH"
# The sources include per-ISA headers (csrc/simd.h, csrc/q4q8/*.h); torch's build versions a
# library by its .cpp files and flags only, so a digest of every file under csrc goes in as a flag
CSRC = Path(__file__).with_name("csrc")
LIBRARY = "kspec_branch_layers"  # torch's builder names a fresh process's build {LIBRARY}.so
BUILT_STAMP = "built.json"  # the flags of the build that finished in the folder


def sources_digest() -> str:
    """A digest of every file under csrc, .cpp and headers alike."""
    digest = hashlib.sha256()
    for path in sorted(CSRC.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(CSRC).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_folder(cache_dir: Path) -> Path:
    """Where the built library lives under kspec's cache folder: per torch version and CPU (and
    `KSPEC_MARCH`, when set)."""
    march = _march()
    return cache_dir / "native" / (f"torch-{torch.__version__}-{_cpu_tag()}" + ("" if march == "native" else f"-{march}"))


def _march() -> str:
    cap = cpu_cap()
    march = os.environ.get(MARCH_VARIABLE, "").strip() or (cap.march if cap is not None else "native")
    if not march.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"${MARCH_VARIABLE} must be a -march value such as haswell or x86-64, got {march!r}")
    return march


def build_flags() -> list[str]:
    """The compiler flags of this build: FLAGS with `KSPEC_MARCH` for -march when set."""
    return [f"-march={_march()}" if flag == "-march=native" else flag for flag in FLAGS]


@functools.lru_cache(maxsize=None)
def cpu_info() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ("vendor_id", "cpu family", "model name",
    ...); empty where the system has no such file."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the end of the first processor's block
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cpu_tag() -> str:
    text = platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
        text += "".join(line for line in info.splitlines() if line.startswith(("model name", "flags")))[:8192]
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=None)
def _built(cache_dir: Path) -> tuple[bool, str]:
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return False, "this PyTorch has no int4 CPU kernel"
    if _registered():  # built under another cache folder in this process: a second copy's ops would abort
        return True, ""
    folder = build_folder(cache_dir)
    flags = [*build_flags(), f"-DKSPEC_CSRC_DIGEST={sources_digest()}"]
    if _load_built(folder, flags):
        return True, ""
    try:
        from torch.utils.cpp_extension import load as build

        folder.mkdir(parents=True, exist_ok=True)
        (folder / BUILT_STAMP).unlink(missing_ok=True)  # a build cut short leaves no stamp on a partial library
        build(LIBRARY, [str(source) for source in SOURCES], extra_cflags=flags, build_directory=str(folder), is_python_module=False, verbose=False)
        (folder / BUILT_STAMP).write_text(json.dumps(flags))
        return True, ""
    except Exception as exc:  # no compiler, headers or ninja: the PyTorch ops serve instead
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return False, f"kspec's C++ CPU ops could not be built ({first_line[:300]})"


def _load_built(folder: Path, flags: list[str]) -> bool:
    """Load the library a finished build left in `folder` for these very flags (the sources' digest
    among them) without asking torch's builder: importing it (setuptools) and its up-to-date check
    cost ~0.17 s of every start. False where there is none, or it does not load: then it is built."""
    library, stamp = folder / f"{LIBRARY}.so", folder / BUILT_STAMP
    try:
        if not library.is_file() or json.loads(stamp.read_text()) != flags:
            return False
        torch.ops.load_library(str(library))
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _registered() -> bool:
    """Whether this process has kspec's ops already."""
    try:
        torch.ops.kspec.branch_layers
    except (AttributeError, RuntimeError):
        return False
    return True


def load(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.branch_layers``, built under ``cache_dir`` if needed (kspec's cache
    folder: engine/models/resolve.py ``cache_root``); None where it cannot be."""
    return torch.ops.kspec.branch_layers if _built(cache_dir)[0] else None


def load_attention(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.branch_attention``: one layer's bifurcated attention as the layer loop
    computes it (queries [R, H, D], the prefix and branch KV, the branch mask, lengths before
    the step, T -> [R, H * D]), for tests against the contract's reference; built as ``load``."""
    return torch.ops.kspec.branch_attention if _built(cache_dir)[0] else None


def load_matmul(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.q4_q8_matmul`` (x [M, K] float32, codes, params -> [M, N] float32; the
    layout: engine/models/quantized.py ``Q4Q8Term``), built as ``load``; None where it cannot be."""
    return torch.ops.kspec.q4_q8_matmul if _built(cache_dir)[0] else None


def load_q8_matmul(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.q8_q8_matmul``: the same kernel over 8-bit codes (a GGUF Q8_0 weight, the
    layout: engine/models/quantized.py ``Q8Q8Term``), vectorized on an AVX-512 VNNI build only
    (``matmul_isa``); built as ``load``; None where it cannot be."""
    return torch.ops.kspec.q8_q8_matmul if _built(cache_dir)[0] else None


def load_q5_matmul(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.q5_q8_matmul``: the 8-bit form's arithmetic over 5-bit codes (GGUF Q5_0 /
    Q5_1 / Q5_K weights; the layout: engine/models/quantized.py ``Q5Q8Term``), vectorized on an
    AVX-512 VNNI or AVX2 build (``matmul_isa``); built as ``load``; None where it cannot be."""
    return torch.ops.kspec.q5_q8_matmul if _built(cache_dir)[0] else None


def load_q6_matmul(cache_dir: Path) -> Callable[..., torch.Tensor] | None:
    """``torch.ops.kspec.q6_q8_matmul``: 6-bit codes with a scale per 16 weights (GGUF Q6_K weights,
    exactly; the layout: engine/models/quantized.py ``Q6Q8Term``), vectorized on an AVX-512 VNNI
    or AVX2 build (``matmul_isa``); built as ``load``; None where it cannot be."""
    return torch.ops.kspec.q6_q8_matmul if _built(cache_dir)[0] else None


def matmul_isa(cache_dir: Path) -> str | None:
    """The instructions ``load_matmul``'s kernel was built with for this CPU: "avx512-vnni",
    "avx2" or "scalar"; None where it cannot be built."""
    return str(torch.ops.kspec.q4_q8_isa()) if _built(cache_dir)[0] else None


def matmul_amx_rows(cache_dir: Path) -> int:
    """The fewest rows ``load_matmul``'s kernel multiplies on AMX's tiles (csrc/q4q8/amx.h), 0 where it
    does not: a build without AMX, Linux refusing the process the tiles' state, or no build."""
    return int(torch.ops.kspec.q4_q8_amx_rows()) if _built(cache_dir)[0] else 0


def unavailable_reason(cache_dir: Path, tried_only: bool = False) -> str:
    """Why ``load(cache_dir)`` gives None ('' when it does not; with tried_only, also '' when
    this process has not asked for the loop yet, so that asking builds nothing)."""
    if tried_only and _built.cache_info().currsize == 0:
        return ""
    return _built(cache_dir)[1]
