"""Which kernel serves which row count, measured on this machine for this model: at the first
start the engine times one layer's projections through every candidate (kspec's 4-/5-/8-bit
kernels, PyTorch's int4 kernel, a dense copy) at the row counts it runs, keeps the winner, and
caches the choice keyed by the CPU, the build and the model's file, so later starts reuse it.

The rows: 1 (one suggestion's step), 4 (k branches), 20 (verifying k x (gamma + 1) drafts) and
64 (a prefill chunk). The 4-bit kernel is the one fastest over a decode round's row counts; a
dense copy is kept only where it is `DENSE_MIN_GAIN` faster at the verification rows (a cold
prefill alone does not pay for its memory) and the machine has `MEMORY_HEADROOM` times its bytes
free. Where the chosen kernel runs the C++ layer loop, a dense copy is not kept: the rows it took
would leave the loop too, which the projections' trial does not see and which costs more than the
copy saves. cpu_profile.py's row is the prior: it orders the candidates and wins a near tie.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import torch
from torch import nn

from kspec.engine.models.cpu_profile import LOOP_KERNEL
from kspec.engine.machine_fit import BUSY_MAX_AGE_S, QUIET_CPU_SHARE, TimedEntries, cpu_share, median_call_ms
from kspec.engine.models.quantized import TERM_SEPARATOR, CpuLinear, Q4Codes, fused_linear, weight_shape, weight_terms

TRIAL_ROWS = (1, 4, 20, 64)  # one suggestion, k branches, k x (gamma + 1) verification, a prefill chunk
DECODE_ROWS = (1, 4, 20)  # the rows of a decode round: the 4-bit kernel is chosen on these
VERIFY_ROWS = 20  # where a dense copy must pay
DENSE_MIN_GAIN = 1.15  # the dense copy this much faster than the 4-bit kernel, or not kept
PRIOR_TIE = 1.03  # a candidate this close to the prior's kernel does not replace it
MEMORY_HEADROOM = 2.0  # a dense copy needs this many times its bytes available
REPEATS = 5  # timed calls per candidate and row count (after one warm-up): the median
TRIAL_METHOD = 2  # part of the cache key: raised when what is timed or how it decides changes
CHOICE_CACHE_FILE = "kernel-choice.json"  # in the cache folder (resolve.cache_root)
CHOICE_MAX_AGE_S = 30 * 24 * 3600.0
CHOICE_ENTRIES = 32
PROJECTIONS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
               ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))  # fmt: skip

Times = dict[str, dict[int, float]]  # candidate -> rows -> ms of the layer's projections


@dataclass(frozen=True)
class KernelChoice:
    """The measured choice and the times behind it."""

    int4_kernel: Literal["kspec", "torch"]
    keep_dense: bool
    int4_max_rows: int  # the 4-bit kernel up to this many rows, the dense copy above (where kept)
    times_ms: Times = field(default_factory=dict)
    why: str = ""
    cpu_share: float = 1.0  # of the cores the measurement had (below QUIET_CPU_SHARE: kept for BUSY_MAX_AGE_S only)

    @property
    def quiet(self) -> bool:
        return self.cpu_share >= QUIET_CPU_SHARE


def decide(
    times: Times, kernels: Sequence[str], dense: str | None, prior: str | None, dense_fits: bool, share: float = 1.0, layer_loop: bool = False,
) -> KernelChoice:
    """The choice from measured times: `kernels` the 4-bit candidates measured, `dense` the dense
    candidate's name (None: not measured), `prior` the profile's kernel, `share` of the cores the
    measurement had, `layer_loop` whether LOOP_KERNEL's rows run in the C++ layer loop."""
    def round_ms(name: str) -> float:
        return sum(times[name][rows] for rows in DECODE_ROWS)

    busy = "" if share >= QUIET_CPU_SHARE else f" (measured with {share:.0%} of the cores: measured again after {BUSY_MAX_AGE_S / 3600:g} h)"
    fastest = min(kernels, key=round_ms)
    kernel = prior if prior in kernels and round_ms(prior) <= PRIOR_TIE * round_ms(fastest) else fastest  # type: ignore[assignment]
    why = [f"{name} {round_ms(name):.2f} ms" for name in kernels]
    text = f"4-bit kernel {kernel}{busy}: one layer's projections at {'+'.join(map(str, DECODE_ROWS))} rows " + ", ".join(why)
    gain = times[kernel][VERIFY_ROWS] / times[dense][VERIFY_ROWS] if dense is not None else 0.0
    if dense is not None and layer_loop and kernel == LOOP_KERNEL:
        text += f"; {dense} copy {gain:.2f}x at {VERIFY_ROWS} rows' projections: not kept (its rows would leave the layer loop)"
        dense = None
    if dense is None:
        return KernelChoice(kernel, False, max(TRIAL_ROWS), times, text, share)
    keep = gain >= DENSE_MIN_GAIN and dense_fits
    reason = "no room" if gain >= DENSE_MIN_GAIN else "does not pay"
    text += f"; {dense} copy {gain:.2f}x at {VERIFY_ROWS} rows: " + ("kept" if keep else f"not kept ({reason})")
    return KernelChoice(kernel, keep, crossover(times[kernel], times[dense]), times, text, share)


def crossover(int4: Mapping[int, float], dense: Mapping[int, float]) -> int:
    """The most rows the 4-bit kernel should take: where the two times cross, linearly between
    the measured row counts; at least 1."""
    rows = sorted(int4)
    last_int4 = max((r for r in rows if int4[r] <= dense[r]), default=0)
    later = [r for r in rows if r > last_int4]
    if last_int4 == 0 or not later:
        return max(1, last_int4)
    nxt = later[0]
    margin_here, margin_next = dense[last_int4] - int4[last_int4], dense[nxt] - int4[nxt]  # >= 0, < 0
    return max(1, int(last_int4 + (nxt - last_int4) * margin_here / (margin_here - margin_next)))


@dataclass(frozen=True)
class Candidates:
    """The 4-bit kernels to time (name -> its matmuls: q4q8, q8q8, q5q8; all None: PyTorch's) and
    the dense dtype (None: no dense candidate)."""

    kernels: Mapping[str, tuple[Callable[..., torch.Tensor] | None, ...]]
    dense_dtype: torch.dtype | None


def trial_layer(codes: Mapping[str, Q4Codes]) -> list[list[list[Q4Codes]]]:
    """The middle layer's projections (fused as the fast path fuses them): each a list of its
    parts' terms; the projections without codes are left out."""
    layers = {int(name.split(".")[2]) for name in codes if name.startswith("model.layers.")}
    if not layers:
        return []
    prefix = f"model.layers.{sorted(layers)[len(layers) // 2]}."
    found = []
    for names in PROJECTIONS:
        terms = [weight_terms(codes, f"{prefix}{name}.weight") for name in names]
        if all(t is not None for t in terms):
            found.append([t for t in terms if t is not None])
    return found


def _int4_linear(parts: list[list[Q4Codes]], matmuls: tuple[Callable[..., torch.Tensor] | None, ...]) -> CpuLinear:
    shells = [nn.Linear(t[0].shape[1], t[0].shape[0], bias=False, device="meta") for t in parts]  # shapes only: no dense weight
    return fused_linear(shells, parts, max(TRIAL_ROWS), torch.float32, False, *matmuls)  # type: ignore[arg-type]


def _dense_linear(parts: list[list[Q4Codes]], dtype: torch.dtype) -> CpuLinear:
    weight = torch.cat([sum(term.dequantize() for term in terms) for terms in parts])  # [N, K] float32
    return CpuLinear([weight], [], None, 0, dtype)


def _time_ms(linears: Sequence[CpuLinear], rows: int) -> float:
    inputs = [torch.randn(rows, linear.in_features, generator=torch.Generator().manual_seed(rows)) for linear in linears]  # [rows, K]

    def call() -> None:
        for linear, x in zip(linears, inputs):
            linear(x)

    with torch.inference_mode():
        return median_call_ms(call, REPEATS)


def measure(layer: list[list[list[Q4Codes]]], candidates: Candidates) -> tuple[Times, float]:
    """Each candidate's time for the layer's projections at each of TRIAL_ROWS, interleaved by row
    count (a noisy moment hits every candidate alike), and the share of the cores the process had
    meanwhile (`machine_fit.cpu_share`: below QUIET_CPU_SHARE other work competed)."""
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    built: dict[str, list[CpuLinear]] = {name: [_int4_linear(parts, mm) for parts in layer] for name, mm in candidates.kernels.items()}
    if candidates.dense_dtype is not None:
        built[dense_name(candidates.dense_dtype)] = [_dense_linear(parts, candidates.dense_dtype) for parts in layer]
    times: Times = {name: {} for name in built}
    for rows in TRIAL_ROWS:
        for name, linears in built.items():
            times[name][rows] = round(_time_ms(linears, rows), 4)
    return times, cpu_share(time.process_time() - cpu_started, time.perf_counter() - wall_started, torch.get_num_threads())


def dense_name(dtype: torch.dtype) -> str:
    return f"dense {str(dtype).removeprefix('torch.')}"


def dense_bytes(codes: Mapping[str, Q4Codes], dtype: torch.dtype) -> int:
    """What a dense copy of every coded weight would hold."""
    shapes = {name.split(TERM_SEPARATOR)[0]: weight_shape(codes, name) for name in codes}
    return sum(n * k for n, k in shapes.values()) * dtype.itemsize


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo; None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ChoiceCache(TimedEntries[KernelChoice]):
    """Choices measured before, by key; a bad entry is a miss."""

    def __init__(self, path: Path, max_age_s: float = CHOICE_MAX_AGE_S, entries: int = CHOICE_ENTRIES):
        super().__init__(path, max_age_s, entries, KernelChoice)
