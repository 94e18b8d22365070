"""Which kernel on which CPU: the one place kspec decides it, each row with the measurement that
chose it. The sessions' full measurements, by CPU class: docs/measurements/.

`CpuFacts.here()` reads what decides (torch's CPU level, the instructions kspec's matmul was built
with, vendor and family, native bfloat16, AMX); `profile_for(facts)` is the first row of
`PROFILES` that matches. Settings (`--cpu-int4`, `--cpu-weights`) override a row: `dense_pays`
is the dense-copy rule for a kernel chosen by hand, and the rows agree with it (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers
from kspec.kernels.cpu_cap import cpu_cap

VNNI_ISA = "avx512-vnni"  # cpu_layers.matmul_isa() of a build with the AVX-512 VNNI loops
INT4_KERNELS = ("torch", "kspec")  # PyTorch's int4 kernel (bfloat16 activations), kspec's 4-bit x 8-bit one


@dataclass(frozen=True)
class CpuFacts:
    """What the choice of kernels depends on."""

    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    matmul_isa: str | None  # what kspec's matmul was built with ("avx512-vnni", "avx2", "scalar"); None: not asked or not built
    vendor: str  # "AuthenticAMD", "GenuineIntel", "" where unknown
    family: int  # the CPU family; 0 where unknown
    native_bf16: bool  # AVX-512-BF16 or AMX
    amx: bool

    @classmethod
    def here(cls) -> "CpuFacts":
        """This machine's facts, no feature above `$KSPEC_CPU`'s cap (kernels/cpu_cap.py). kspec's
        matmul is built (once, cached) on the CPUs its kernels vectorize: AVX-512 and AVX2."""
        cap = cpu_cap()
        capability = torch.backends.cpu.get_cpu_capability()
        if cap is not None and not cap.avx512 and capability.startswith("AVX512"):
            capability = "AVX2"  # torch's own level when ATEN_CPU_CAPABILITY was set after it looked
        info = cpu_layers.cpu_info()
        family = info.get("cpu family", "")
        amx = torch.cpu._is_amx_tile_supported() and (cap is None or cap.amx)  # torch's test reads the CPU, not the limit
        bf16 = torch.cpu._is_avx512_bf16_supported() and (cap is None or cap.bf16)
        return cls(
            capability=capability,
            matmul_isa=cpu_layers.matmul_isa(cache_root()) if capability in ("AVX512", "AVX2") else None,
            vendor=info.get("vendor_id", ""),
            family=int(family) if family.isdigit() else 0,
            native_bf16=bf16 or amx,
            amx=amx,
        )


@dataclass(frozen=True)
class CpuProfile:
    """One CPU class's defaults and the measurement behind them."""

    name: str
    int4_kernel: str | None  # "torch" / "kspec"; None: no vectorized 4-bit kernel, `--dtype auto` is float32
    dense_copy: bool  # keep a dense copy of the weights for many-row matmuls (prefill, verification)
    why: str  # the measured reason
    measured_in: str  # where the measurement is written up

    def __post_init__(self) -> None:
        if self.int4_kernel not in (None, *INT4_KERNELS):
            raise ValueError(f"int4_kernel must be one of {', '.join(INT4_KERNELS)} or None, got {self.int4_kernel!r}")


def _amd_zen4_or_later_with_vnni(facts: CpuFacts) -> bool:
    # AMD family 0x19 with AVX-512 is Zen 4 (Zen 3, also 0x19, has no AVX-512), 0x1A is Zen 5
    return facts.capability == "AVX512" and facts.matmul_isa == VNNI_ISA and facts.vendor == "AuthenticAMD" and facts.family >= 0x19


PROFILES: tuple[tuple[Callable[[CpuFacts], bool], CpuProfile], ...] = (
    (_amd_zen4_or_later_with_vnni, CpuProfile(
        "AMD Zen 4 / Zen 5, kspec's AVX-512 VNNI build", "kspec", False,
        "kspec's kernel faster than PyTorch's at every row count: Zen 5, the default model's 120 projections, "
        "2.6-2.7 vs 3.3-3.4 ms at 1 row, 4.6-5.0 vs 6.8-7.4 at 8, 17.8-18.7 vs 28.3-29.0 at 40; Zen 4 whole steps "
        "1.14x / 1.26x / 1.06x / 1.07x at 1 / 4 / 8 / 40 rows. No dense copy: 40 verification rows no slower "
        "without it, it only sped a cold prefill (1.37x) for 2.31x llama-server's memory instead of 1.58x",
        "docs/measurements/zen5.md, docs/measurements/zen4.md")),
    (lambda facts: facts.capability == "AVX512" and facts.amx and facts.matmul_isa == VNNI_ISA, CpuProfile(
        "Intel AVX-512 with AMX, kspec's AVX-512 VNNI build", "kspec", False,
        "the measured choice on an AMX VM (Xeon, 2 cores): one layer's projections kspec 0.35 / 0.50 / 1.66 ms at "
        "1 / 4 / 20 rows against PyTorch's int4 kernel 1.03 / 1.82 / 7.74; whole decode steps of the 0.5B 20.5 vs "
        "58.9 ms at k = 1, 52.8 vs 84.0 ms verifying 4 x 5 rows against PyTorch's kernel with a bfloat16 copy. "
        "No dense copy: rows it takes leave the layer loop (verify 4 x 5 83.8 ms with it from 14 rows); it "
        "only speeds a cold prefill (2.15x) for 2.6x the weights' memory",
        "docs/measurements/amx-real-models.md")),
    (lambda facts: facts.capability == "AVX512" and facts.amx, CpuProfile(
        "AVX-512 with AMX, no kspec build", "torch", True,
        "PyTorch's int4 kernel up to 4 rows, a bfloat16 copy in oneDNN's layout above: 4 rows 7.9 ms 4-bit vs "
        "11.4 packed, 6 rows 13.9 vs 11.3; 40 verification rows 56 vs 158 ms with the 4-bit weights alone",
        "docs/measurements/amx.md")),
    (lambda facts: facts.capability == "AVX512" and facts.native_bf16, CpuProfile(
        "AVX-512-BF16 without AMX (no measured VNNI build)", "torch", True,
        "the AMX crossover holds: k = 6 32.0 ms with the copy above 4 rows vs 35.5 with 4-bit to 8 or 16 rows; "
        "40 verification rows 76.6 vs 121.7 ms without the copy",
        "docs/measurements/avx512-bf16-no-amx.md")),
    (lambda facts: facts.capability == "AVX512", CpuProfile(
        "AVX-512 without BF16 (Intel AVX-512 VNNI not measured with kspec's kernel)", "torch", False,
        "emulated bfloat16 matmuls are slower than float32 ones; a float32 copy costs 4x the 4-bit weights' "
        "memory for a ~1.7x faster cold prefill and no faster verification",
        "docs/measurements/avx512-no-vnni.md")),
    (lambda facts: facts.capability == "AVX2", CpuProfile(
        "AVX2", "kspec", False,
        "PyTorch's int4 kernel is not vectorized well on AVX2: Zen 2, 30 layers' projections at one row 9.2 ms "
        "vs 5.5 with kspec's kernel",
        "docs/measurements/avx2-zen2.md, docs/measurements/zen3-avx2.md")),
)
NO_FAST_PATH = CpuProfile(
    "other", None, False, "no vectorized 4-bit kernel for this CPU: float32 is faster than an emulated one", "")


def profile_for(facts: CpuFacts) -> CpuProfile:
    """The first row of `PROFILES` that matches these facts, else `NO_FAST_PATH`."""
    return next((profile for matches, profile in PROFILES if matches(facts)), NO_FAST_PATH)


# The kernel the C++ layer loop runs (engine/models/native_step.py). Rows a dense copy takes leave the
# loop for PyTorch's ops: on an Intel AMX VM (0.5B, verify 4 x 5 rows) 83.8 ms with a copy from 14
# rows against 52.8 ms in the loop, though the copy's projections alone were 1.25x faster at 20 rows
# (docs/measurements/amx-real-models.md); above the verification rows it would serve a cold prefill
# only, which does not pay for its memory. So no dense copy with it (`dense_pays`, kernel_choice.decide)
LOOP_KERNEL = "kspec"


def dense_pays(int4_kernel: str, facts: CpuFacts) -> bool:
    """The dense-copy rule for a kernel: with PyTorch's int4 kernel wherever the CPU computes
    bfloat16 natively; never with LOOP_KERNEL, whose C++ layer loop the copy's rows would leave."""
    return int4_kernel != LOOP_KERNEL and facts.native_bf16


# The 4-bit kernel's rows per matmul, the dense copy above, by kernel and dense dtype: the measured
# crossovers (30 layers of the default model's projections, weights streamed, 2 threads). float32
# copies catch up with PyTorch's kernel at ~16 rows; bfloat16 ones on AMX between 4 and 6 rows;
# with kspec's VNNI kernel (Zen 5) at ~24 rows (24 rows 11.8-12.7 vs 11.7-11.9 ms).
INT4_MAX_ROWS = {
    ("torch", torch.float32): 16, ("torch", torch.bfloat16): 4, ("kspec", torch.float32): 16, ("kspec", torch.bfloat16): 24,
}

# The forms each build runs where they pay, by cpu_layers.matmul_isa(); elsewhere a Q8_0 weight
# stays two 4-bit terms and Q5_x / Q6_K weights take the 8-bit form. The 8-bit form on AVX2 measured
# on Zen 3 (the head, one 8-bit term vs two 4-bit ones): 1.12x at 1 row, 1.28x at 4, 1.34x at 8,
# 1.36x at 40. The 5- and 6-bit forms against the 8-bit form of the same codes (a 53760 x 1536
# weight, a -march=haswell build on Zen 4): 5-bit 1.43x at 1 row, 1.34x at 4, 1.19x at 20; 6-bit
# 1.18x at 1 row, 1.10x at 4, but 0.95x at 8 and 0.85x at 20. In the models' decode step
# (KSPEC_CPU=avx2, both forms in one process): the 0.5B with its Q5_0 weights 5-bit 1.08x at k = 1
# and 4, 1.05x verifying 40 rows; the 1.5B with its Q6_K ones 6-bit 0.97x at k = 1, 0.91x at 40 rows.
# With the higher bits byte-aligned (a shift and a mask a register; 6-bit 1.55x faster at 1 row,
# 1.28x at 4 than with the old bit planes) the 1.5B's 6-bit head is faster at 20 rows (38.6-40.5
# vs 48-49 ms) but slower at 4 (13.6-13.9 vs 12.2-13.1), and beside llama.cpp the 8-bit form stays
# ahead (kspec bench peer, AVX2 both sides: 6-bit 1.21x / 1.45x, 8-bit 1.30x / 1.48x): AVX2 keeps
# Q6_K 8-bit (docs/measurements/zen4-byte-aligned-bits.md).
Q8Q8_ISAS = (VNNI_ISA, "avx2")
Q5Q8_ISAS = (VNNI_ISA, "avx2")
Q6Q8_ISAS = (VNNI_ISA,)


def kernel_forms(isa: str | None) -> tuple[str, ...]:
    """The forms beside the 4-bit one that kspec's kernel runs on a build for `isa` (what the
    weights are laid out in depends on them: tiled_store.store_path)."""
    return tuple(name for name, isas in (("q8", Q8Q8_ISAS), ("q5", Q5Q8_ISAS), ("q6", Q6Q8_ISAS)) if isa in isas)

# One call of the head on kspec's kernel (a row's logits do not depend on the others in the call),
# (ms a call, ms a row): the prior of engine/models/head_cost.py's HeadCost until the machine fit
# times the model's own head. The default 0.5B's 8-bit head on Intel AMX (VNNI build): 5.3 ms at 1
# row, 6.2 at 4, 6.5 at 8, 7.7 at 12, 9.1 at 16, 10.6 at 20; KSPEC_CPU=avx2 there: 6.6, 8.8, 13.3,
# 18.1, 23.1, 27.9 (medians of 7).
HEAD_COST_PRIOR = {VNNI_ISA: (5.01, 0.28), "avx2": (5.47, 1.12)}
