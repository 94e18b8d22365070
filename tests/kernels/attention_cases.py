"""Shared shapes and inputs for the attention kernel tests (imported by test_*.py here)."""

from __future__ import annotations

import torch

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}

Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_case(
    k: int, heads: int, kv_heads: int, new: int, dim: int, prefix: int, capacity: int,
    lengths: list[int], dtype: torch.dtype = torch.float32, seed: int = 0, junk: float = 0.0,
) -> Case:
    """Random q / prefix / branch tensors; entries beyond each length hold ``junk`` noise."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    q = rand(k, heads, new, dim)  # [k, H, T, D]
    pk, pv = rand(1, kv_heads, prefix, dim), rand(1, kv_heads, prefix, dim)  # [1, Hkv, P, D]
    bk, bv = rand(k, kv_heads, capacity, dim), rand(k, kv_heads, capacity, dim)  # [k, Hkv, S, D]
    for b, n in enumerate(lengths):
        bk[b, :, n:] = (rand(kv_heads, capacity - n, dim).float() * junk).to(dtype)
        bv[b, :, n:] = (rand(kv_heads, capacity - n, dim).float() * junk).to(dtype)
    return q, pk, pv, bk, bv, torch.tensor(lengths, dtype=torch.int64)


def valid_rows(lengths: torch.Tensor, heads: int, new: int) -> torch.Tensor:
    """[k, H, T] True where query t has its own position in its branch (len - T + t >= 0)."""
    ok = (lengths[:, None] - new + torch.arange(new)) >= 0  # [k, T]
    return ok[:, None, :].expand(-1, heads, -1)


def assert_close(out: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want.double(), **TOL[dtype])


# name, (k, H, Hkv, T, D, P, S, lengths, window)
CASES = {
    "decode_gqa_smollm": (4, 9, 3, 1, 64, 37, 12, [12, 5, 1, 9], None),
    "verify_ragged": (3, 4, 2, 5, 32, 20, 16, [16, 5, 9], None),
    "no_prefix": (2, 4, 1, 3, 16, 0, 8, [8, 3], None),
    "no_branch_kv": (3, 2, 2, 1, 8, 11, 0, [0, 0, 0], None),
    "single_branch": (1, 8, 8, 2, 16, 5, 4, [3], None),
    "shorter_than_T": (4, 6, 3, 4, 16, 6, 10, [10, 2, 0, 4], None),
    "empty_everything": (2, 2, 1, 2, 8, 0, 0, [0, 0], None),
    "mha_long_prefix": (5, 4, 4, 1, 32, 300, 7, [7, 1, 3, 6, 2], None),
    "window_in_branch": (3, 4, 2, 3, 16, 30, 12, [12, 3, 7], 5),
    "window_into_prefix": (3, 4, 2, 3, 16, 30, 12, [12, 3, 7], 20),
    "window_self_only": (2, 4, 2, 3, 16, 9, 6, [6, 3], 1),
    "window_no_prefix": (2, 6, 3, 2, 16, 0, 9, [9, 4], 3),
    "window_covers_all": (2, 6, 3, 2, 16, 25, 9, [9, 4], 1000),
}
