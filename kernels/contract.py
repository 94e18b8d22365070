"""Bifurcated attention: one shared prompt prefix, k branches with their own KV.

The contract every implementation keeps: the layout and masking rules below, checked
by ``check_inputs``. Implementations: ``reference`` (plain PyTorch, any device) and
``triton_bifurcated`` (CUDA); ``bifurcated`` picks one.

Layout (see ``bifurcated_attention``):

    q          [k, H, T, D]      the T newest tokens of each of the k branches
    prefix_k/v [1, Hkv, P, D]    shared prompt KV, stored once (P may be 0)
    branch_k/v [k, Hkv, S, D]    per-branch KV buffers, S = allocated capacity
    lengths    [k]               valid entries per branch, the T new ones included

Positions: prefix keys sit at 0..P-1, branch b's entries at P..P+len_b-1, and query t
of branch b at P + len_b - T + t. Query t sees every prefix key and branch keys
j <= len_b - T + t (causal inside the new tokens, ragged across branches).

The attention over (prefix ++ branch) is computed as two pieces merged with their
softmax statistics (log-sum-exp): the prefix piece is ONE batched matmul for all
k*T*(H/Hkv) queries of a KV head against the single copy of the prefix, the branch
piece is a per-branch matmul over at most max(lengths) columns. GQA is handled by
folding the H/Hkv query heads of a KV head into the query rows, never by repeating KV.

Branches with len_b < T: query rows t < T - len_b have no branch key of their own;
their output is "don't care" (they attend to the prefix only, or are 0 when there is
no key at all) but always finite, so they never poison the valid rows. Branch buffer
entries at or beyond len_b are never given weight, but must hold finite numbers
(0 * NaN is NaN in the value product): allocate buffers with zeros, not ``empty``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from kspec.kernels.transfer import to_device

@dataclass(frozen=True)
class Dims:
    """Sizes of one bifurcated-attention call, validated."""

    k: int  # branches
    heads: int  # H, query heads
    new: int  # T, new tokens per branch
    dim: int  # D, head dimension
    kv_heads: int  # Hkv
    prefix: int  # P
    capacity: int  # S

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.heads // self.kv_heads


def check_inputs(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    sliding_window: int | None = None,
) -> Dims:
    """Validate shapes, dtypes and devices (no device sync); return the sizes."""
    if q.dim() != 4:
        raise ValueError(f"q must be [k, H, T, D], got shape {tuple(q.shape)}")
    k, heads, new, dim = q.shape
    if new < 1:
        raise ValueError("q must hold at least one new token per branch (T >= 1)")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        if t.dim() != 4 or t.shape[0] != 1 or t.shape[3] != dim:
            raise ValueError(f"{name} must be [1, Hkv, P, {dim}], got shape {tuple(t.shape)}")
    if prefix_k.shape != prefix_v.shape:
        raise ValueError(f"prefix_k {tuple(prefix_k.shape)} and prefix_v {tuple(prefix_v.shape)} differ")
    kv_heads, prefix = prefix_k.shape[1], prefix_k.shape[2]
    for name, t in (("branch_k", branch_k), ("branch_v", branch_v)):
        if t.dim() != 4 or t.shape[0] != k or t.shape[1] != kv_heads or t.shape[3] != dim:
            raise ValueError(f"{name} must be [{k}, {kv_heads}, S, {dim}], got shape {tuple(t.shape)}")
    if branch_k.shape != branch_v.shape:
        raise ValueError(f"branch_k {tuple(branch_k.shape)} and branch_v {tuple(branch_v.shape)} differ")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"H={heads} query heads must be a multiple of Hkv={kv_heads} KV heads")
    if branch_lengths.shape != (k,) or branch_lengths.dtype.is_floating_point or branch_lengths.dtype == torch.bool:
        raise ValueError(f"branch_lengths must be an integer tensor of shape [{k}], got "
                         f"{branch_lengths.dtype} {tuple(branch_lengths.shape)}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q must be a floating tensor, got {q.dtype}")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v), ("branch_k", branch_k), ("branch_v", branch_v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}, q has {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if branch_lengths.device != q.device:
        raise ValueError(f"branch_lengths is on {branch_lengths.device}, q on {q.device}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    return Dims(k, heads, new, dim, kv_heads, prefix, branch_k.shape[2])


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax pieces in fp32 for half types (fp64 stays fp64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def lengths_list(branch_lengths: Tensor, capacity: int) -> list[int]:
    """The branch lengths on the host (one device sync), each checked to lie in [0, S]."""
    lengths = [int(x) for x in branch_lengths.tolist()]
    bad = [x for x in lengths if x < 0 or x > capacity]
    if bad:
        raise ValueError(f"branch_lengths must lie in [0, S={capacity}], got {bad}")
    return lengths


@dataclass(frozen=True)
class BranchLayout:
    """What every layer's attention call of one forward pass shares, built once per pass so
    that nothing inside the layer loop waits on the device or rebuilds a mask: the branch
    lengths (the T new entries included) on the device and on the host, and the branch
    piece's additive mask."""

    lengths: Tensor  # [k] int64 on the tensors' device
    host_lengths: tuple[int, ...]  # the same numbers on the host
    new: int  # T
    branch_mask: Tensor | None  # [k, 1, T, max(lengths)] 0 / -inf; None when every query sees every column

    @classmethod
    def build(
        cls,
        lengths: Sequence[int],
        new: int,
        dtype: torch.dtype,
        device: torch.device | str,
        sliding_window: int | None = None,
    ) -> "BranchLayout":
        """lengths per branch including the T = new tokens written this pass; the mask follows
        the masking rules above (causal inside the new tokens, ragged lengths, the window)."""
        host = tuple(int(n) for n in lengths)
        if new < 1 or any(n < 0 for n in host):
            raise ValueError(f"a layout needs T >= 1 and lengths >= 0, got T={new}, lengths {host}")
        device_lengths = to_device(host, torch.int64, device)  # [k], queued without waiting on the device
        cols = max(host, default=0)
        if cols == 0 or (new == 1 and min(host) == cols and (sliding_window is None or cols <= sliding_window)):
            return cls(device_lengths, host, new, None)
        qpos = device_lengths[:, None] + torch.arange(-new, 0, device=device)  # [k, T] own position of each query
        j = torch.arange(cols, device=device)  # [N]
        hidden = j > qpos[..., None]  # [k, T, N]
        if sliding_window is not None:
            hidden |= j <= qpos[..., None] - sliding_window
        mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, -math.inf)
        return cls(device_lengths, host, new, mask[:, None])  # [k, 1, T, N]
