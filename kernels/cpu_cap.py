"""`KSPEC_CPU`: one setting that caps every CPU feature kspec detects, so a machine with AVX-512
(and AMX) runs as the laptop without it would: kspec's kernels built for the capped -march,
PyTorch's ATen kernels and oneDNN held to the same level, and the engine's CPU facts
(engine/models/cpu_profile.py `CpuFacts`) reporting no feature above it.

Values: `native` (or unset: no cap), `avx2`, `avx512`, `avx512-vnni`. PyTorch reads its two
limits once, when it first picks a kernel: `apply_to_environment` sets them before that (the
`kspec` command does it first thing); a library user sets them himself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import MutableMapping

CPU_VARIABLE = "KSPEC_CPU"


@dataclass(frozen=True)
class CpuCap:
    """What a capped CPU may use."""

    name: str
    march: str  # kspec's kernels' -march
    aten: str  # ATEN_CPU_CAPABILITY
    onednn: str  # ONEDNN_MAX_CPU_ISA
    avx512: bool
    bf16: bool  # native bfloat16 (AVX-512-BF16)
    amx: bool


CAPS = {
    "avx2": CpuCap("avx2", "haswell", "avx2", "AVX2", avx512=False, bf16=False, amx=False),
    "avx512": CpuCap("avx512", "skylake-avx512", "avx512", "AVX512_CORE", avx512=True, bf16=False, amx=False),
    "avx512-vnni": CpuCap("avx512-vnni", "cascadelake", "avx512", "AVX512_CORE_VNNI", avx512=True, bf16=False, amx=False),
}
NO_CAP_NAMES = ("", "native")


def cpu_cap(environ: MutableMapping[str, str] | None = None) -> CpuCap | None:
    """The cap `KSPEC_CPU` sets, None without one; a value not known is the user's error."""
    value = (os.environ if environ is None else environ).get(CPU_VARIABLE, "").strip().lower()
    if value in NO_CAP_NAMES:
        return None
    if value not in CAPS:
        raise ValueError(f"${CPU_VARIABLE} must be one of native, {', '.join(CAPS)}; got {value!r}")
    return CAPS[value]


def apply_to_environment(environ: MutableMapping[str, str] | None = None) -> CpuCap | None:
    """Hold PyTorch and oneDNN to the cap (values the user set himself stay); returns the cap."""
    env = os.environ if environ is None else environ
    cap = cpu_cap(env)
    if cap is not None:
        env.setdefault("ATEN_CPU_CAPABILITY", cap.aten)
        env.setdefault("ONEDNN_MAX_CPU_ISA", cap.onednn)
    return cap
