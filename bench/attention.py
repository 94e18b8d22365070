"""Attention-only benchmark: bifurcated vs replicated KV, interleaved in one run.

Replicated = what a batch-k decoder without prefix sharing runs each step: every branch
holds its own copy of the prompt KV ([k, Hkv, P+S, D], built once, outside the timing)
and ``dense_attention`` reads all of it. Bifurcated = ``bifurcated_attention`` reading the
one copy of the prompt KV ([1, Hkv, P, D]) plus each branch's own KV. Both are timed in
the same process, alternating A B A B, and reported as medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from kspec.bench.baselines import dense_attention
from kspec.kernels.bifurcated import bifurcated_attention

__all__ = ["bench_attention", "SHAPES", "main"]

# (heads, kv_heads, head_dim) of the model shapes the benchmark knows by name.
SHAPES: dict[str, tuple[int, int, int]] = {
    "smollm2-135m": (9, 3, 64),  # GQA
    "7b-mha": (32, 32, 128),  # llama-2-7b style MHA
}


def _ragged_lengths(k: int, branch_tokens: int, new_tokens: int) -> list[int]:
    """Uneven branch lengths in [max(new_tokens, branch_tokens // 2), branch_tokens]."""
    low = max(new_tokens, branch_tokens // 2)
    span = branch_tokens - low + 1
    return [branch_tokens - (7 * b) % span for b in range(k)]


def _time_ms(fn: Callable[[], Tensor], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _one_case(
    k: int, context: int, repeats: int, warmup: int, dtype: torch.dtype, heads: int, kv_heads: int,
    head_dim: int, new_tokens: int, branch_tokens: int, device: torch.device, seed: int,
) -> dict[str, Any]:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q = rand(k, heads, new_tokens, head_dim)  # [k, H, T, D]
    prefix_k, prefix_v = rand(1, kv_heads, context, head_dim), rand(1, kv_heads, context, head_dim)  # [1, Hkv, P, D]
    branch_k, branch_v = rand(k, kv_heads, branch_tokens, head_dim), rand(k, kv_heads, branch_tokens, head_dim)
    lengths = torch.tensor(_ragged_lengths(k, branch_tokens, new_tokens), device=device)  # [k]
    full_k = torch.cat([prefix_k.expand(k, -1, -1, -1), branch_k], dim=2)  # [k, Hkv, P+S, D]
    full_v = torch.cat([prefix_v.expand(k, -1, -1, -1), branch_v], dim=2)  # [k, Hkv, P+S, D]
    full_lengths = lengths + context

    def replicated() -> Tensor:
        return dense_attention(q, full_k, full_v, full_lengths)

    def bifurcated() -> Tensor:
        return bifurcated_attention(q, prefix_k, prefix_v, branch_k, branch_v, lengths)

    tol = 1e-4 if dtype == torch.float32 else 2e-2
    diff = (replicated().float() - bifurcated().float()).abs().max().item()
    if not diff <= tol:
        raise RuntimeError(f"bifurcated and replicated attention disagree by {diff} at k={k}, context={context}")
    times_a: list[float] = []
    times_b: list[float] = []
    for i in range(warmup + repeats):  # interleaved: A B A B ...
        a = _time_ms(replicated, device)
        b = _time_ms(bifurcated, device)
        if i >= warmup:
            times_a.append(a)
            times_b.append(b)
    rep, bif = statistics.median(times_a), statistics.median(times_b)
    return {"k": k, "context": context, "replicated_ms": round(rep, 4), "bifurcated_ms": round(bif, 4),
            "ratio": round(rep / bif, 3)}


def bench_attention(
    ks: Sequence[int] = (4, 8, 16, 32),
    contexts: Sequence[int] = (1024, 4096, 8192),
    repeats: int = 5,
    dtype: torch.dtype = torch.float32,
    heads: int = 9,
    kv_heads: int = 3,
    head_dim: int = 64,
    new_tokens: int = 1,
    branch_tokens: int = 32,
    warmup: int = 1,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """Time one attention call, replicated vs bifurcated KV, for every k x context.

    Defaults: decode (T = 1 new token), SmolLM2-135M heads (H=9, Hkv=3, D=64), branches
    holding 16..32 tokens of their own (uneven). Returns
    ``{"config": {...}, "cases": [{"k", "context", "replicated_ms", "bifurcated_ms", "ratio"}]}``
    with medians over ``repeats`` timed calls of each (after ``warmup``), ratio = replicated / bifurcated.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    if branch_tokens < new_tokens:
        raise ValueError(f"branch_tokens ({branch_tokens}) must be >= new_tokens ({new_tokens})")
    dev = torch.device(device)
    cases = [
        _one_case(k, context, repeats, warmup, dtype, heads, kv_heads, head_dim, new_tokens, branch_tokens, dev,
                  seed + i)
        for i, (context, k) in enumerate((c, k) for c in contexts for k in ks)
    ]
    cases.sort(key=lambda c: (c["k"], c["context"]))
    config = {
        "device": str(dev), "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
        "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "new_tokens": new_tokens,
        "branch_tokens": branch_tokens, "repeats": repeats, "warmup": warmup,
        "replicated": "dense_attention over KV stored once per branch (prompt copied k times)",
        "bifurcated": "bifurcated_attention over one prompt KV + per-branch KV",
    }
    return {"config": config, "cases": cases}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kspec.bench.attention [--json]``: run ``bench_attention`` from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=1, help="T: 1 = decode, gamma+1 = verify")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    heads, kv_heads, head_dim = SHAPES[args.shape]
    report = bench_attention(
        args.ks, args.contexts, args.repeats, getattr(torch, args.dtype), heads, kv_heads, head_dim,
        new_tokens=args.new_tokens, device=args.device,
    )
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'k':>4} {'context':>8} {'replicated ms':>14} {'bifurcated ms':>14} {'ratio':>7}")
        for c in report["cases"]:
            print(f"{c['k']:>4} {c['context']:>8} {c['replicated_ms']:>14.3f} {c['bifurcated_ms']:>14.3f} "
                  f"{c['ratio']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
