"""`kspec bench step`: one whole decode step (logits included) per compute path, interleaved.

For each path (`--dtype` values: float32 is today's exact path, auto the CPU fast path;
`auto/4bit` and `auto/4bit+dense` pin the fast path's `--cpu-weights`, `auto/torch` its
`--cpu-kernels`: PyTorch ops instead of the C++ layer loop, `auto/int4=kspec` its `--cpu-int4`,
`auto/kv=float32` its `--cpu-kv`)
and each row count —
k branches x 1 new token for k in --ks, and the verification of k_max x (gamma + 1) drafted
positions — one forward pass over a shared prompt prefix (the engine's BranchKVCache,
bifurcated attention) plus the logits of every row; the same verification with its logits as
the serving path takes them when every draft is rejected (greedy acceptance on the CPU scores a
position only after the draft before it matched: the first position's k rows); and the cold
prefill of the whole prompt (the prefix cache's chunks, the last row's logits), what a new
document or place costs.
Runs of all paths alternate (A B A B), medians per cell, ratios against the first path.

Also the floor: the bytes a step must read (the weights each matmul reads at that row count
plus the KV it attends over) divided by this machine's memory bandwidth, measured once with
a large tensor copy. A step at the floor is bound by memory, not by per-op overhead.
"""

from __future__ import annotations

import inspect
import json.decoder
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import msgspec
import torch
from torch import nn

from kspec.bench.stats import median, time_interleaved
from kspec.engine.cache.kv import BranchKVCache
from kspec.engine.cache.prefix_cache import prefill_uncached
from kspec.engine.config import CPU_KERNELS, EngineConfig
from kspec.engine.decode.acceptance import accept_greedy_by_position
from kspec.engine.models.loading import LoadedModel, load_model
from kspec.engine.models.quantized import CpuLinear
from kspec.engine.models.transformer import Transformer

GENERATED = 16  # entries each branch holds already (mid-completion), as in a real round
BANDWIDTH_BYTES = 256 << 20  # the copy that measures memory bandwidth: far beyond any cache


@dataclass(frozen=True)
class StepCase:
    k: int  # branches
    new: int  # T, positions per branch (1: a decode step; gamma + 1: a verification)
    rejected: bool = False  # a verification whose every draft is rejected, its logits as the serving path takes them

    @property
    def rows(self) -> int:
        return self.k * self.new

    @property
    def logit_rows(self) -> int:
        """Rows the head takes: all of them, or the first position's where every draft is rejected
        (greedy acceptance on the CPU scores position j + 1 only after draft j matched)."""
        return self.k if self.rejected else self.rows

    @property
    def label(self) -> str:
        if self.new == 1:
            return f"k={self.k}"
        return f"verify {self.k}x{self.new}" + (", drafts rejected" if self.rejected else "")


def memory_bandwidth(repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (each byte read once and written once)."""
    source = torch.ones(BANDWIDTH_BYTES // 4)
    target = torch.empty_like(source)
    target.copy_(source)  # touch the pages first
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        seconds.append(time.perf_counter() - started)
    return 2 * BANDWIDTH_BYTES / float(median(seconds))


def weight_bytes_read(model: Transformer, rows: int, logit_rows: int) -> int:
    """Bytes of weights one forward pass reads at this row count: each CpuLinear's 4-bit or
    dense form as it would choose, every other linear's weight, and the head for logit_rows."""
    total = sum(_linear_bytes(module, rows) for module in model.model.layers.modules())
    return total + (_linear_bytes(model.lm_head, logit_rows) if logit_rows else 0)


def _linear_bytes(module: nn.Module, rows: int) -> int:
    if isinstance(module, CpuLinear):
        if module.uses_int4(rows):
            return sum(t.nbytes for t in module.terms)
        return module.dense_nbytes
    if isinstance(module, nn.Linear):
        return module.weight.nbytes
    return 0


def resident_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (shared storage counted once): both forms of a
    CpuLinear, its dense weights in oneDNN's layout included."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()]}
    packed = sum(m.dense_nbytes for m in model.modules() if isinstance(m, CpuLinear) and m.packed is not None)
    return sum(storages.values()) + packed


def _kv_bytes_read(cache: BranchKVCache, new: int) -> int:
    """The prefix once plus each branch's entries (what bifurcated attention reads), each in its
    own dtype (a float16 prompt KV: 2 bytes an element)."""
    per_element = 2 * cache.shape.n_layers * cache.shape.n_kv_heads * cache.shape.head_dim  # keys and values
    prefix = cache.prefix_len * cache.prefix_keys.element_size()
    own = sum(n + new for n in cache.lengths) * cache.keys.element_size()
    return per_element * (prefix + own)


def _step_runner(model: Transformer, cache: BranchKVCache, case: StepCase) -> Callable[[], int]:
    tokens = torch.full((case.k, case.new), 7, dtype=torch.long)  # [k, T]

    never = [[-1] * (case.new - 1)] * case.k  # drafts no argmax equals

    def run() -> int:
        with torch.inference_mode():
            hidden = model(tokens, cache)  # [k, T, dim]; not advanced: each run writes the same slots
            if case.rejected:  # the serving path's acceptance (engine/decode/speculative.py): the head at position 0
                accept_greedy_by_position(never, hidden, model.logits, lambda first: first)
            else:
                model.logits(hidden if case.new > 1 else hidden[:, -1])  # [k, T, V] or [k, V]
        return 1

    return run


INT4_PIN = "int4="  # a --paths pin of --cpu-int4
KV_PIN = "kv="  # a --paths pin of --cpu-kv


def path_config(config: EngineConfig, path: str) -> EngineConfig:
    """A --paths entry: a --dtype value, then optionally /<--cpu-weights value>,
    /<--cpu-kernels value>, /int4=<--cpu-int4 value> and /kv=<--cpu-kv value> (auto/4bit,
    auto/torch, auto/int4=kspec, auto/4bit/int4=torch, auto/kv=float32)."""
    dtype, *pins = path.split("/")
    int4 = [pin.removeprefix(INT4_PIN) for pin in pins if pin.startswith(INT4_PIN)]
    kv = [pin.removeprefix(KV_PIN) for pin in pins if pin.startswith(KV_PIN)]
    kernels = [pin for pin in pins if pin in CPU_KERNELS]
    weights = [pin for pin in pins if pin not in CPU_KERNELS and not pin.startswith((INT4_PIN, KV_PIN))]
    if len(kernels) > 1 or len(weights) > 1 or len(int4) > 1 or len(kv) > 1:
        raise ValueError(f"{path!r}: at most one --cpu-weights, one --cpu-kernels, one int4= and one kv= value")
    return replace(
        config, dtype=dtype, cpu_weights=weights[0] if weights else config.cpu_weights,
        cpu_kernels=kernels[0] if kernels else config.cpu_kernels, cpu_int4=int4[0] if int4 else config.cpu_int4,
        cpu_kv=kv[0] if kv else config.cpu_kv,
    )  # fmt: skip


def _prefill_runner(model: Transformer, prompt: list[int]) -> Callable[[], int]:
    def run() -> int:
        with torch.inference_mode():
            prefill_uncached(model, prompt)
        return 1

    return run


def _branch_caches(model: Transformer, prompt: list[int], cases: list[StepCase]) -> dict[StepCase, BranchKVCache]:
    prefill = prefill_uncached(model, prompt)
    caches = {}
    for case in cases:
        cache = BranchKVCache.from_prompt(prefill.cache, case.k, GENERATED + case.new + 1)
        with torch.inference_mode():
            model(torch.full((case.k, GENERATED), 5, dtype=torch.long), cache)
        cache.advance(GENERATED)
        caches[case] = cache
    return caches


def bench_step(
    config: EngineConfig,
    ks: list[int],
    paths: list[str],
    prompt_tokens: int = 512,
    repeats: int = 9,
) -> dict[str, Any]:
    """The report of `kspec bench step --json` (see the module docstring)."""
    if not paths:
        raise ValueError("bench step needs at least one path (a --dtype value)")
    cases = [StepCase(k, 1) for k in ks] + [StepCase(max(ks), config.gamma + 1, rejected) for rejected in (False, True)]
    try:
        configs = {path: path_config(config, path) for path in paths}
    except ValueError as exc:
        raise ValueError(f"bench step paths are --dtype values, optionally /<--cpu-weights>/<--cpu-kernels value>/int4=<--cpu-int4 value>/kv=<--cpu-kv value>: {exc}") from exc
    loaded: dict[str, LoadedModel] = {path: load_model(config.model, configs[path]) for path in paths}
    prompt = inspect.getsource(json.decoder)
    ids = loaded[paths[0]].tokenizer.encode(prompt * (1 + prompt_tokens // 2000))[:prompt_tokens]
    caches = {path: _branch_caches(target.model, ids, cases) for path, target in loaded.items()}
    bandwidth = memory_bandwidth()
    rows: list[dict[str, Any]] = []
    for case in cases:
        runs = {path: _step_runner(loaded[path].model, caches[path][case], case) for path in paths}
        for run in runs.values():
            run()  # warm-up: first-call allocations and kernel selection
        rates = time_interleaved(runs, repeats)
        ms = {path: 1000 / float(median(rate)) for path, rate in rates.items()}
        floor = {
            path: 1000 * (weight_bytes_read(loaded[path].model, case.rows, case.logit_rows)
                          + _kv_bytes_read(caches[path][case], case.new)) / bandwidth
            for path in paths
        }  # fmt: skip
        rows.append(
            {
                "case": case.label,
                "k": case.k,
                "new": case.new,
                "rows": case.rows,
                "ms": {path: round(value, 2) for path, value in ms.items()},
                "speedup": {path: round(ms[paths[0]] / value, 2) for path, value in ms.items()},
                "floor_ms": {path: round(value, 2) for path, value in floor.items()},
            }
        )
    prefills = {path: _prefill_runner(loaded[path].model, ids) for path in paths}
    for run in prefills.values():
        run()
    prefill_ms = {path: 1000 / float(median(rate)) for path, rate in time_interleaved(prefills, max(3, repeats // 3)).items()}
    rows.append(
        {
            "case": f"cold prefill {len(ids)}",
            "k": 1,
            "new": len(ids),
            "rows": len(ids),
            "ms": {path: round(value, 1) for path, value in prefill_ms.items()},
            "speedup": {path: round(prefill_ms[paths[0]] / value, 2) for path, value in prefill_ms.items()},
        }
    )
    single = next((row for row in rows if row["k"] == 1 and row["new"] == 1), None)
    return {
        "model": loaded[paths[0]].name,
        "threads": torch.get_num_threads(),
        "prompt_tokens": len(ids),
        "generated_per_branch": GENERATED,
        "repeats": repeats,
        "paths": {path: target.compute for path, target in loaded.items()},
        "kernel_choice": {path: msgspec.to_builtins(t.model.kernel_choice) for path, t in loaded.items() if t.model.kernel_choice is not None},
        "memory_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "resident_weights_mb": {path: round(resident_bytes(t.model) / 2**20, 1) for path, t in loaded.items()},
        "cases": rows,
        "batch1_tok_s": None if single is None else {path: round(1000 / v, 1) for path, v in single["ms"].items()},
    }
