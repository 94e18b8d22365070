#!/usr/bin/env python3
"""One-shot GPU check of the Triton bifurcated-attention kernel: correctness and speed.

    python scripts/gpu_check.py [--quick] [--bandwidth-tbs 4.8]

1. Correctness: ``triton_bifurcated_attention`` vs the PyTorch reference (on the same GPU)
   over decode / verify / GQA / MHA / P = 0 / ragged / window shapes in fp32, bf16, fp16.
2. Speed (decode, 7B-like MHA and SmolLM2-like GQA, bf16): the kernel vs the reference
   (bifurcated, in PyTorch) vs replicated KV (``dense_attention`` over k copies of the
   prompt), and vs the floor = bytes the step must read and write / HBM bandwidth
   (H200 about 4.8 TB/s). Times are medians from ``triton.testing.do_bench`` (L2 flushed).

Prints one JSON report. Exit status: 0 when all checks pass, or when there is no CUDA
device (nothing to check; says so); 1 when a check fails or triton is missing.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from kspec.bench.baselines import dense_attention  # noqa: E402
from kspec.kernels import triton_bifurcated as tb  # noqa: E402
from kspec.kernels.reference import reference_bifurcated_attention  # noqa: E402

TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}  # max |kernel - reference| / (1 + |reference|)

# name: (k, H, Hkv, T, D, P, S, lengths (None: ragged S/2..S), window)
CORRECTNESS: dict[str, tuple[int, int, int, int, int, int, int, list[int] | None, int | None]] = {
    "decode_gqa_smollm_k16_8k": (16, 9, 3, 1, 64, 8192, 64, None, None),
    "verify_gqa_T5_k8_4k": (8, 9, 3, 5, 64, 4096, 40, None, None),
    "decode_mha_7b_k16_8k": (16, 32, 32, 1, 128, 8192, 64, None, None),
    "verify_mha_T4_k4_1k": (4, 32, 32, 4, 128, 1000, 37, None, None),
    "no_prefix": (4, 8, 2, 3, 64, 0, 20, [20, 3, 9, 1], None),
    "branch_shorter_than_T": (4, 8, 2, 4, 64, 300, 10, [10, 2, 0, 4], None),
    "single_branch": (1, 16, 4, 1, 128, 2048, 8, [8], None),
    "long_branches_multi_split": (3, 8, 4, 2, 64, 700, 2000, [2000, 1333, 5], None),
    "window_4096_mistral_like": (8, 32, 8, 1, 128, 8192, 64, None, 4096),
    "window_small": (3, 8, 2, 3, 64, 200, 30, [30, 12, 3], 17),
    "head_dim_80": (4, 8, 8, 2, 80, 513, 16, None, None),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Speed: (shape name, H, Hkv, D); k x P grid; decode (T = 1), branches of 32..64 tokens, bf16.
SPEED_SHAPES = (("7b_mha", 32, 32, 128), ("smollm2_gqa", 9, 3, 64))
SPEED_KS = (4, 8, 16, 32)
SPEED_CONTEXTS = (1024, 8192)


def make_inputs(k: int, h: int, hkv: int, t: int, d: int, p: int, s: int, lengths: list[int] | None,
                dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    if lengths is None:
        low = max(t, s // 2)
        lengths = [s - (7 * b) % (s - low + 1) for b in range(k)]
    q = rand(k, h, t, d)  # [k, H, T, D]
    pk, pv = rand(1, hkv, p, d), rand(1, hkv, p, d)  # [1, Hkv, P, D]
    bk, bv = rand(k, hkv, s, d), rand(k, hkv, s, d)  # [k, Hkv, S, D]
    return [q, pk, pv, bk, bv, torch.tensor(lengths, device="cuda")]


def check_correctness() -> list[dict[str, Any]]:
    results = []
    for name, (k, h, hkv, t, d, p, s, lengths, window) in CORRECTNESS.items():
        for dtype in DTYPES:
            row: dict[str, Any] = {"case": name, "dtype": str(dtype).removeprefix("torch."), "tol": TOL[dtype]}
            try:
                inputs = make_inputs(k, h, hkv, t, d, p, s, lengths, dtype)
                out = tb.triton_bifurcated_attention(*inputs, sliding_window=window).float()
                want = reference_bifurcated_attention(*inputs, sliding_window=window).float()
                err = ((out - want).abs() / (1 + want.abs())).max().item()
                row.update(max_rel_err=err, ok=bool(torch.isfinite(out).all().item()) and err <= TOL[dtype])
            except Exception as exc:  # report every case, not just the first failure
                row.update(error=f"{type(exc).__name__}: {exc}"[:500], ok=False)
            results.append(row)
    return results


def floor_bytes(inputs: list[torch.Tensor]) -> int:
    """What a bifurcated decode step must move: prefix K/V once, each branch's valid K/V, q, out."""
    q, pk, pv, bk, _, lengths = inputs
    elt = q.element_size()
    hkv, d = pk.shape[1], pk.shape[3]
    kv = 2 * hkv * d * elt * (pk.shape[2] + int(lengths.sum()))
    return kv + 2 * q.numel() * elt


def check_speed(bandwidth: float, ks: tuple[int, ...], contexts: tuple[int, ...]) -> list[dict[str, Any]]:
    from triton.testing import do_bench

    results = []
    for shape, h, hkv, d in SPEED_SHAPES:
        for p in contexts:
            for k in ks:
                inputs = make_inputs(k, h, hkv, 1, d, p, 64, None, torch.bfloat16)
                q, pk, pv, bk, bv, lengths = inputs
                full_k = torch.cat([pk.expand(k, -1, -1, -1), bk], dim=2)  # [k, Hkv, P+S, D]
                full_v = torch.cat([pv.expand(k, -1, -1, -1), bv], dim=2)  # [k, Hkv, P+S, D]
                full_lengths = lengths + p
                kernel_ms = do_bench(lambda: tb.triton_bifurcated_attention(*inputs), return_mode="median")
                reference_ms = do_bench(lambda: reference_bifurcated_attention(*inputs), return_mode="median")
                replicated_ms = do_bench(lambda: dense_attention(q, full_k, full_v, full_lengths),
                                         return_mode="median")
                nbytes = floor_bytes(inputs)
                floor_ms = nbytes / bandwidth * 1e3
                results.append({
                    "shape": shape, "k": k, "context": p, "dtype": "bfloat16",
                    "kernel_ms": round(kernel_ms, 4), "reference_ms": round(reference_ms, 4),
                    "replicated_ms": round(replicated_ms, 4), "floor_ms": round(floor_ms, 4),
                    "floor_fraction": round(floor_ms / kernel_ms, 3),
                    "speedup_vs_reference": round(reference_ms / kernel_ms, 2),
                    "speedup_vs_replicated": round(replicated_ms / kernel_ms, 2),
                })
                del full_k, full_v
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth for the floor (H200: 4.8)")
    parser.add_argument("--quick", action="store_true", help="speed grid k in {16}, context in {8192} only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device: nothing to check (the CPU path is covered by pytest)"}))
        return 0
    if not tb.TRITON_AVAILABLE:
        print(json.dumps({"error": "CUDA is available but triton is not installed: pip install 'kspec[gpu]'"}))
        return 1
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "bandwidth_tbs": args.bandwidth_tbs,
    }
    report["correctness"] = check_correctness()
    failed = [f"{r['case']}/{r['dtype']}" for r in report["correctness"] if not r["ok"]]
    ks, contexts = ((16,), (8192,)) if args.quick else (SPEED_KS, SPEED_CONTEXTS)
    try:
        report["speed"] = check_speed(args.bandwidth_tbs * 1e12, ks, contexts)
    except Exception as exc:  # keep the correctness report
        report["speed_error"] = f"{type(exc).__name__}: {exc}"[:1000]
        failed.append("speed")
    report["failed"] = failed
    print(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
