#!/usr/bin/env python3
"""One prepared device check: attention kernels against the reference, and a 7B-shaped decode
step against the bandwidth floor. Prints ONE JSON object.

    python scripts/gpu_check.py                  # on a CUDA machine (about 2-6 minutes on one H200)
    python scripts/gpu_check.py --smoke          # tiny shapes, any machine (CPU): exercises every section
    python scripts/gpu_check.py --shape qwen2-7b --budget-s 420 --out report.json

Sections (each reports its own error instead of ending the run; a section that would start
after ``--budget-s`` seconds is reported as skipped):

1. ``environment``: device, versions, the attention paths the engine takes (kernels/paths.py).
2. ``bandwidth``: device memory bandwidth measured with a copy (bytes read + written / time).
3. ``kernels`` (run last, after the model's sections): every installed path (flash-attn, Triton; CPU: the fused CPU kernel) against the
   PyTorch reference on decode / verify / GQA / MHA / ragged / window / P = 0 shapes, fp32 bf16 fp16
   (flash-attn: bf16 fp16); the flash-attn prefill against SDPA.
4. ``decode``: a 7B-shaped model with random weights (Llama-2-7B: MHA; or Qwen2-7B: GQA), bf16,
   one decode step of k branches (bifurcated cache, logits included) at k in {1, 8, 16, 32} and
   1k / 8k context, against the floor = (weights read + KV read) / measured bandwidth.
5. ``bifurcated_vs_replicated``: the same step with the prompt's KV replicated per branch (a plain
   batch cache) at k = 16 / 32, 8k context: whole-step ratio. When k copies of the prompt's KV do not
   fit, every layer reads one layer-sized buffer (the same bytes per step; said in the report).
6. ``bass``: k = 8, 1k context, a draft of the same family scaled down: regular step, draft step,
   verify step and a whole BASS round (γ draft steps, the verify pass, acceptance read back once) as
   a function of γ. Random weights accept nothing, so the report also gives the per-token time and
   speedup a round would have at acceptance rates α (expected tokens per round (1 - α^(γ+1)) / (1 - α)).
7. ``cuda_graph``: the k = 8, 1k step eager vs replayed from a CUDA graph (whether graphs pay).

Exit status: 0 when every check passed; 1 when a correctness check or a section failed; 0 with
{"skipped": ...} without CUDA unless --smoke.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kspec.engine.cache.kv import BranchKVCache, CacheShape, RaggedKVCache
from kspec.engine.decode.acceptance import accept_greedy_rows, read_round
from kspec.engine.models.args import ModelArgs
from kspec.engine.models.rope import inverse_frequencies
from kspec.engine.models.transformer import Transformer
from kspec.kernels import flash_bifurcated as fb
from kspec.kernels import triton_bifurcated as tb
from kspec.kernels.bifurcated import bifurcated_attention
from kspec.kernels.paths import Installed, attention_paths
from kspec.kernels.reference import reference_bifurcated_attention

# HF config.json fields of the shapes measured (random weights; nothing is downloaded).
SHAPES: dict[str, dict[str, Any]] = {
    "llama2-7b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-5},
    "qwen2-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                 "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "rms_norm_eps": 1e-6,
                 "rope_theta": 1000000.0},
    "tiny": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5},
}  # fmt: skip
DRAFT_SCALE = 4  # the draft: hidden, heads and intermediate / 4, layers / 4 (Llama-2-7B -> ~0.2B)

# name: (k, H, Hkv, T, D, P, S, lengths (None: ragged S/2..S), window)
KERNEL_CASES: dict[str, tuple[int, int, int, int, int, int, int, list[int] | None, int | None]] = {
    "decode_gqa_k16_8k": (16, 28, 4, 1, 128, 8192, 64, None, None),
    "verify_gqa_T5_k8_4k": (8, 28, 4, 5, 128, 4096, 40, None, None),
    "decode_mha_7b_k16_8k": (16, 32, 32, 1, 128, 8192, 64, None, None),
    "verify_mha_T4_k4_1k": (4, 32, 32, 4, 128, 1000, 37, None, None),
    "decode_smollm_gqa_k8": (8, 9, 3, 1, 64, 2048, 32, None, None),
    "no_prefix": (4, 8, 2, 3, 64, 0, 20, [20, 3, 9, 3], None),
    "single_branch": (1, 16, 4, 1, 128, 2048, 8, [8], None),
    "long_branches_multi_split": (3, 8, 4, 2, 64, 700, 2000, [2000, 1333, 5], None),
    "window_mistral_like": (8, 32, 8, 1, 128, 8192, 64, None, 4096),
    "window_within_branch_reach": (3, 8, 2, 3, 64, 200, 30, [30, 12, 3], 400),
    "head_dim_80": (4, 8, 8, 2, 80, 513, 16, None, None),
}  # fmt: skip
SMOKE_KERNEL_CASES = {
    "decode_gqa": (4, 4, 2, 1, 16, 40, 8, None, None),
    "verify_ragged": (3, 4, 2, 3, 16, 20, 10, [10, 4, 7], None),
    "no_prefix": (2, 4, 1, 2, 16, 0, 6, [6, 3], None),
    "window": (3, 4, 2, 2, 16, 10, 8, [8, 3, 5], 30),
}
TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}  # max |path - reference| / (1 + |reference|)


@dataclass(frozen=True)
class Plan:
    """What one run measures (the full device run, or the smoke run's tiny version of it)."""

    device: str
    dtype: torch.dtype
    shape: str
    kernel_cases: dict = field(default_factory=lambda: KERNEL_CASES)
    kernel_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
    contexts: tuple[int, ...] = (1024, 8192)
    ks: tuple[int, ...] = (1, 8, 16, 32)
    replicated_ks: tuple[int, ...] = (16, 32)
    replicated_context: int = 8192
    bass_k: int = 8
    bass_context: int = 1024
    gammas: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    branch_tokens: int = 16  # each branch's own entries before the step
    shared_kv_for: tuple[int, ...] = ()  # replicated k's that use one layer's buffer even when k copies fit
    copy_bytes: int = 2 << 30
    warmup: int = 3
    iters: int = 10

    @classmethod
    def smoke(cls) -> "Plan":
        return cls(
            device="cpu", dtype=torch.bfloat16, shape="tiny", kernel_cases=SMOKE_KERNEL_CASES,
            kernel_dtypes=(torch.float32, torch.bfloat16), contexts=(32, 64), ks=(1, 2, 4), replicated_ks=(2, 4),
            replicated_context=64, bass_k=2, bass_context=32, gammas=(1, 2), alphas=(0.5, 0.8), branch_tokens=4,
            shared_kv_for=(4,), copy_bytes=8 << 20, warmup=1, iters=2,
        )  # fmt: skip


# -- timing -------------------------------------------------------------------------------------


def time_ms(fn: Callable[[], Any], device: str, warmup: int, iters: int) -> float:
    """Median milliseconds of fn() (CUDA: events around each call; CPU: wall clock)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure_bandwidth(plan: Plan) -> dict[str, Any]:
    """Bytes moved by a device-to-device copy (read + write) per second."""
    n = plan.copy_bytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=plan.device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), plan.device, plan.warmup, plan.iters)
    moved = 2 * src.numel() * src.element_size()
    return {"copy_bytes": moved, "copy_ms": round(ms, 4), "bytes_per_s": moved / (ms / 1000), "tb_per_s": round(moved / (ms / 1000) / 1e12, 3)}


# -- 1. kernels ---------------------------------------------------------------------------------


def _kernel_inputs(case: tuple, dtype: torch.dtype, device: str, seed: int = 0) -> list[torch.Tensor]:
    k, h, hkv, t, d, p, s, lengths, _ = case
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    if lengths is None:
        low = max(t, s // 2)
        lengths = [s - (7 * b) % (s - low + 1) for b in range(k)]
    return [rand(k, h, t, d), rand(1, hkv, p, d), rand(1, hkv, p, d), rand(k, hkv, s, d), rand(k, hkv, s, d),
            torch.tensor(lengths, device=device)]  # fmt: skip


def _paths_to_check(plan: Plan) -> dict[str, Callable[..., torch.Tensor] | str]:
    """Each installed path as fn(inputs, window), or the reason it is not checked."""
    paths: dict[str, Callable[..., torch.Tensor] | str] = {}
    cuda = plan.device.startswith("cuda")
    fa = fb.load()
    if fa is None:
        paths["flash-attn"] = "skipped: flash-attn (>= 2.6, with a CUDA build) is not installed"
    elif not cuda:
        paths["flash-attn"] = "skipped: flash-attn needs CUDA"
    else:
        paths["flash-attn"] = lambda x, w: fb.flash_bifurcated_attention(*x, None, w, fa)
    if not tb.TRITON_AVAILABLE:
        paths["triton"] = "skipped: triton is not installed (pip install 'kspec[gpu]')"
    elif not cuda:
        paths["triton"] = "skipped: the Triton kernel runs on CUDA (on CPU only in its interpreter, see tests)"
    else:
        paths["triton"] = lambda x, w: tb.triton_bifurcated_attention(*x, sliding_window=w)
    paths["dispatch"] = lambda x, w: bifurcated_attention(*x, sliding_window=w)  # what the engine calls
    return paths


def check_kernels(plan: Plan) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    paths = _paths_to_check(plan)
    for name, case in plan.kernel_cases.items():
        window = case[8]
        for dtype in plan.kernel_dtypes:
            inputs = _kernel_inputs(case, dtype, plan.device)
            want = reference_bifurcated_attention(*inputs, sliding_window=window).float()
            k, _, _, t, _, p, _, _, _ = case
            own = (inputs[5][:, None] - t + torch.arange(t, device=plan.device)) >= 0  # [k, T] rows with keys of their own
            for path, run in paths.items():
                if isinstance(run, str):
                    continue
                row: dict[str, Any] = {"case": name, "dtype": str(dtype).removeprefix("torch."), "path": path, "tol": TOL[dtype]}
                if path == "flash-attn" and (dtype not in fb.DTYPES or case[4] % 8 or not fb.supports(inputs[0], p, inputs[5].tolist(), window)):
                    continue  # outside what the path computes (the dispatcher takes the next one)
                try:
                    out = run(inputs, window).float()
                    err = ((out - want).abs() / (1 + want.abs()))[own[:, None, :, None].expand_as(want)].max().item()
                    row.update(max_rel_err=err, ok=bool(torch.isfinite(out).all().item()) and err <= TOL[dtype])
                except Exception as exc:  # report every case, not only the first failure
                    row.update(error=f"{type(exc).__name__}: {exc}"[:400], ok=False)
                rows.append(row)
    result: dict[str, Any] = {"checked": rows, "not_checked": {p: r for p, r in paths.items() if isinstance(r, str)}}
    result["prefill"] = check_prefill(plan)
    result["failed"] = [f"{r['case']}/{r['dtype']}/{r['path']}" for r in rows if not r["ok"]] + [
        f"prefill/{r['case']}" for r in result["prefill"] if isinstance(r, dict) and not r.get("ok", True)
    ]
    return result


def check_prefill(plan: Plan) -> list[dict[str, Any]] | str:
    """The plain-cache path (prefill; ragged rows) against SDPA over the same cache."""
    if fb.load() is None or not plan.device.startswith("cuda"):
        return "skipped: the flash-attn prefill needs CUDA and flash-attn"
    rows = []
    for name, starts, new in (("prefill_uniform", [0, 0], 512), ("chunk_after_prefix", [300, 300], 64), ("ragged", [5, 0, 90], 7)):
        cache = RaggedKVCache(CacheShape(1, 4, 128), len(starts), max(starts) + new + 8, torch.bfloat16, plan.device)
        cache.lengths = list(starts)
        g = torch.Generator(device=plan.device).manual_seed(1)
        q = torch.randn(len(starts), 32, new, 128, generator=g, device=plan.device).bfloat16()  # [B, H, T, D]
        k, v = (torch.randn(len(starts), 4, new, 128, generator=g, device=plan.device).bfloat16() for _ in range(2))
        step = cache.prepare(new)
        out = cache.attend(0, q, k, v, step).float()
        want = F.scaled_dot_product_attention(
            q, cache.keys[0][:, :, : step.kv_len], cache.values[0][:, :, : step.kv_len], attn_mask=step.mask,
            is_causal=step.is_causal, enable_gqa=True,
        ).float()  # fmt: skip
        err = ((out - want).abs() / (1 + want.abs())).max().item()
        rows.append({"case": name, "max_rel_err": err, "ok": err <= TOL[torch.bfloat16]})
    return rows


# -- 2. a 7B-shaped model --------------------------------------------------------------------------


def model_args(shape: str, scale: int = 1) -> ModelArgs:
    config = dict(SHAPES[shape])
    if scale > 1:  # the draft: the same family, scaled down
        heads = max(1, config["num_attention_heads"] // scale)
        kv_heads = max(1, min(heads, config["num_key_value_heads"]))
        while heads % kv_heads:
            kv_heads -= 1
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        config.update(hidden_size=heads * head_dim, intermediate_size=config["intermediate_size"] // scale,
                      num_hidden_layers=max(1, config["num_hidden_layers"] // scale), num_attention_heads=heads,
                      num_key_value_heads=kv_heads)  # fmt: skip
    return ModelArgs.from_hf_config(config)


def random_model(args: ModelArgs, dtype: torch.dtype, device: str, seed: int) -> Transformer:
    """Random weights allocated directly on the device in ``dtype`` (no float32 copy on the host)."""
    with torch.device("meta"):
        model = Transformer(args)
    model = model.to(dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=g)
    model.inv_freq = inverse_frequencies(args.head_dim, args.rope_theta, args.rope_scaling).to(device)
    return model.eval()


def weight_bytes_read(model: Transformer) -> int:
    """Bytes of weights one step reads: every parameter but the embedding table (k rows of it)."""
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.lm_head.weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


def kv_bytes_per_token(args: ModelArgs, dtype: torch.dtype) -> int:
    return 2 * args.n_layers * args.n_kv_heads * args.head_dim * torch.finfo(dtype).bits // 8


def branch_cache(model: Transformer, k: int, context: int, branch_tokens: int, capacity: int) -> BranchKVCache:
    """A shared prompt of ``context`` tokens (zeros: kernel time does not depend on values) and k
    branches holding ``branch_tokens`` entries each."""
    shape = model.cache_shape
    prefix = torch.zeros(shape.n_layers, 1, shape.n_kv_heads, context, shape.head_dim, dtype=model.dtype, device=model.device)
    cache = BranchKVCache(shape, prefix, torch.zeros_like(prefix), k, capacity)
    cache.lengths = [branch_tokens] * k
    return cache


def replicated_cache(model: Transformer, k: int, length: int, capacity: int, share_layers: bool) -> RaggedKVCache:
    """k rows of ``length`` entries each (the prompt copied per branch). share_layers: every
    layer's view is the same one-layer buffer (same bytes read per step, 1/L of the memory)."""
    shape = model.cache_shape
    cache = RaggedKVCache(CacheShape(1, shape.n_kv_heads, shape.head_dim) if share_layers else shape, k, capacity, model.dtype, model.device)
    if share_layers:
        cache.keys = cache.keys.expand(shape.n_layers, -1, -1, -1, -1)  # [L, k, Hkv, C, D], one layer's storage
        cache.values = cache.values.expand(shape.n_layers, -1, -1, -1, -1)
        cache.shape = shape
    cache.lengths = [length] * k
    return cache


def step_fn(model: Transformer, cache, k: int, new: int = 1) -> Callable[[], torch.Tensor]:
    """One forward pass of ``new`` tokens per row and the logits of every position, without
    advancing the cache (each call rewrites the same slots: a steady-state step)."""
    tokens = torch.ones(k, new, dtype=torch.int64, device=model.device)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.logits(model(tokens, cache))

    return run


def _free_bytes(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # blocks PyTorch keeps cached count as used in the driver's figure
        return torch.cuda.mem_get_info()[0]
    return 1 << 62  # the CPU smoke run's shapes are tiny


def measure_decode(plan: Plan, model: Transformer, bandwidth: float) -> list[dict[str, Any]]:
    args, weights = model.args, weight_bytes_read(model)
    per_token = kv_bytes_per_token(args, model.dtype)
    rows = []
    for context in plan.contexts:
        for k in plan.ks:
            cache = branch_cache(model, k, context, plan.branch_tokens, plan.branch_tokens + 8)
            ms = time_ms(step_fn(model, cache, k), plan.device, plan.warmup, plan.iters)
            kv = per_token * (context + k * (plan.branch_tokens + 1))
            floor_ms = (weights + kv) / bandwidth * 1000
            rows.append({
                "k": k, "context": context, "step_ms": round(ms, 4), "floor_ms": round(floor_ms, 4),
                "vs_floor": round(ms / floor_ms, 3), "weights_bytes": weights, "kv_bytes": kv,
                "ms_per_token_per_sequence": round(ms, 4), "tokens_per_s": round(k / ms * 1000, 1),
            })  # fmt: skip
            del cache
    return rows


def measure_replicated(plan: Plan, model: Transformer, bandwidth: float) -> list[dict[str, Any]]:
    args, weights = model.args, weight_bytes_read(model)
    per_token = kv_bytes_per_token(args, model.dtype)
    context, rows = plan.replicated_context, []
    for k in plan.replicated_ks:
        bifurcated = branch_cache(model, k, context, plan.branch_tokens, plan.branch_tokens + 8)
        bif_ms = time_ms(step_fn(model, bifurcated, k), plan.device, plan.warmup, plan.iters)
        del bifurcated
        length = context + plan.branch_tokens
        need = per_token * k * (length + 8)
        share = need > 0.8 * _free_bytes(plan.device) or k in plan.shared_kv_for
        replicated = replicated_cache(model, k, length, length + 8, share)
        rep_ms = time_ms(step_fn(model, replicated, k), plan.device, plan.warmup, plan.iters)
        del replicated
        rep_floor = (weights + per_token * k * (length + 1)) / bandwidth * 1000
        bif_floor = (weights + per_token * (context + k * (plan.branch_tokens + 1))) / bandwidth * 1000
        rows.append({
            "k": k, "context": context, "bifurcated_ms": round(bif_ms, 4), "replicated_ms": round(rep_ms, 4),
            "speedup": round(rep_ms / bif_ms, 3), "floor_speedup": round(rep_floor / bif_floor, 3),
            "replicated_floor_ms": round(rep_floor, 4), "bifurcated_floor_ms": round(bif_floor, 4),
            "replicated_kv_storage": "one layer's buffer read by every layer (k copies do not fit)" if share else "per layer",
        })  # fmt: skip
    return rows


def measure_bass(plan: Plan, model: Transformer) -> dict[str, Any]:
    """Regular decoding vs BASS rounds at k = plan.bass_k with a scaled-down draft of random weights."""
    k, context = plan.bass_k, plan.bass_context
    draft = random_model(model_args(plan.shape, DRAFT_SCALE), model.dtype, plan.device, seed=1)
    room = plan.branch_tokens + max(plan.gammas) + 4
    target_cache = branch_cache(model, k, context, plan.branch_tokens, room)
    draft_cache = branch_cache(draft, k, context, plan.branch_tokens, room)
    timed = lambda fn: time_ms(fn, plan.device, plan.warmup, plan.iters)  # noqa: E731
    regular_ms = timed(step_fn(model, target_cache, k))
    draft_ms = timed(step_fn(draft, draft_cache, k))
    by_gamma = []
    for gamma in plan.gammas:
        verify_ms = timed(step_fn(model, target_cache, k, gamma + 1))
        round_ms = timed(_bass_round(model, draft, target_cache, draft_cache, k, gamma))
        row: dict[str, Any] = {"gamma": gamma, "verify_ms": round(verify_ms, 4), "verify_vs_regular": round(verify_ms / regular_ms, 3),
                               "round_ms": round(round_ms, 4), "at_acceptance": {}}  # fmt: skip
        for alpha in plan.alphas:
            tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)  # expected tokens per branch per round
            row["at_acceptance"][str(alpha)] = {
                "ms_per_token_per_sequence": round(round_ms / tokens, 4), "speedup_vs_regular": round(regular_ms * tokens / round_ms, 3)
            }
        by_gamma.append(row)
    best = {
        str(alpha): max(by_gamma, key=lambda r: r["at_acceptance"][str(alpha)]["speedup_vs_regular"])["gamma"] for alpha in plan.alphas
    }
    return {
        "k": k, "context": context, "draft_params": sum(p.numel() for p in draft.parameters()),
        "regular_step_ms": round(regular_ms, 4), "draft_step_ms": round(draft_ms, 4), "by_gamma": by_gamma,
        "best_gamma_by_acceptance": best,
        "note": "random weights accept nothing: round_ms is measured (γ draft steps, one verify pass, the acceptance "
                "read back once); speedups are what that round gives at acceptance rate α",
    }  # fmt: skip


def _bass_round(model: Transformer, draft: Transformer, target_cache: BranchKVCache, draft_cache: BranchKVCache,
                k: int, gamma: int) -> Callable[[], Any]:  # fmt: skip
    """One BASS round without advancing either cache: γ draft steps (greedy, on the device), the
    target's pass over k x (γ + 1) rows, the acceptance, ONE read back to the host."""
    last = torch.ones(k, 1, dtype=torch.int64, device=model.device)
    lengths = torch.full((k,), gamma, dtype=torch.int64, device=model.device)  # every branch drafts γ tokens

    def run() -> Any:
        with torch.inference_mode():
            token, drafted = last, []
            for step in range(gamma):
                token = draft.logits(draft(token, draft_cache)[:, -1]).argmax(-1, keepdim=True)  # [k, 1]
                drafted.append(token)
            rows = torch.cat([last, *drafted], dim=1)  # [k, γ+1]
            logits = model.logits(model(rows, target_cache))  # [k, γ+1, V]
            accepted, taken = accept_greedy_rows(rows[:, 1:], lengths, logits)
            return read_round(accepted, taken, torch.log_softmax(logits, -1))

    return run


def measure_cuda_graph(plan: Plan, model: Transformer) -> dict[str, Any]:
    """The k = 8, 1k-context decode step eager vs one CUDA graph replay of it."""
    if not plan.device.startswith("cuda"):
        return {"skipped": "CUDA graphs need a GPU"}
    k, context = plan.bass_k, plan.bass_context
    cache = branch_cache(model, k, context, plan.branch_tokens, plan.branch_tokens + 8)
    run = step_fn(model, cache, k)
    eager_ms = time_ms(run, plan.device, plan.warmup, plan.iters)
    prepared = cache.prepare(1)  # positions, lengths and masks built once, outside the graph (no host copy inside)
    cache.prepare = lambda n_new: prepared  # type: ignore[method-assign]  # the step never advances: the same every replay
    eager_prepared_ms = time_ms(run, plan.device, plan.warmup, plan.iters)  # the same, without the host's per-step preparation
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            run()
    except Exception as exc:  # e.g. a host-to-device copy inside the step cannot be captured
        return {"eager_ms": round(eager_ms, 4), "eager_prepared_ms": round(eager_prepared_ms, 4),
                "error": f"capture failed: {type(exc).__name__}: {exc}"[:400]}  # fmt: skip
    graph_ms = time_ms(graph.replay, plan.device, plan.warmup, plan.iters)
    return {"k": k, "context": context, "eager_ms": round(eager_ms, 4), "eager_prepared_ms": round(eager_prepared_ms, 4),
            "graph_ms": round(graph_ms, 4), "graph_speedup": round(eager_ms / graph_ms, 3)}  # fmt: skip


# -- the run ----------------------------------------------------------------------------------------


def run_sections(plan: Plan, budget_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    report: dict[str, Any] = {"smoke": plan.device == "cpu", "shape": plan.shape, "dtype": str(plan.dtype).removeprefix("torch.")}
    failed: list[str] = []

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if time.perf_counter() - started > budget_s:
            report[name] = {"skipped": f"time budget of {budget_s:.0f} s spent"}
            return None
        began = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            failed.append(name)
            return None
        report[name] = value
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - began, 2)
        return value

    args = model_args(plan.shape)
    section("environment", lambda: environment(plan, args))
    bandwidth = section("bandwidth", lambda: measure_bandwidth(plan))
    model = section("model", lambda: random_model(args, plan.dtype, plan.device, seed=0))
    if model is not None:
        report["model"] = {"shape": plan.shape, "params": sum(p.numel() for p in model.parameters()),
                           "weights_bytes_read_per_step": weight_bytes_read(model),
                           "kv_bytes_per_token": kv_bytes_per_token(args, plan.dtype)}  # fmt: skip
        bytes_per_s = bandwidth["bytes_per_s"] if bandwidth else float("nan")
        section("decode", lambda: measure_decode(plan, model, bytes_per_s))
        section("bifurcated_vs_replicated", lambda: measure_replicated(plan, model, bytes_per_s))
        section("bass", lambda: measure_bass(plan, model))
        section("cuda_graph", lambda: measure_cuda_graph(plan, model))
        del model
        _free_bytes(plan.device)
    # last: a kernel that faults leaves the CUDA context unusable for whatever would come after it
    kernels = section("kernels", lambda: check_kernels(plan))
    if kernels:
        failed += [f"kernels:{name}" for name in kernels["failed"]]
    report["failed"] = failed
    report["total_s"] = round(time.perf_counter() - started, 1)
    return report


def environment(plan: Plan, args: ModelArgs) -> dict[str, Any]:
    found = Installed.detect()
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if plan.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "python": sys.version.split()[0],
        "flash_attn": getattr(fb.load(), "__version__", None), "triton": __import__("triton").__version__ if found.triton else None,
        "attention_paths": attention_paths(plan.device, plan.dtype, args.head_dim, found),
    }  # fmt: skip
    return info


def _finite(value: Any) -> Any:
    """The report with NaN / infinite floats as null (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on this machine's CPU: every section's code path in seconds")
    parser.add_argument("--shape", choices=[s for s in SHAPES if s != "tiny"], default="llama2-7b",
                        help="the 7B shape (llama2-7b: MHA, as the bifurcated-attention paper; qwen2-7b: GQA)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=420.0, help="no section starts after this many seconds")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        plan = Plan.smoke()
    elif not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device: nothing to measure (run with --smoke to exercise the code paths)"}))
        return 0
    else:
        plan = Plan(device="cuda", dtype=torch.bfloat16, shape=args.shape)
    report = run_sections(plan, args.budget_s)
    text = json.dumps(_finite(report), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
