"""Test oracle for attention: explicit per-query softmax in float64 (slow; tests only)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kspec.kernels.contract import check_inputs, lengths_list


def naive_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Test oracle: per branch and per query, softmax over an explicit list of visible keys,
    KV heads repeated, in float64. Rows with no visible key are 0. Slow; tests only."""
    d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
    lengths = lengths_list(branch_lengths, d.capacity)
    scale = 1.0 / math.sqrt(d.dim) if scale is None else scale
    out = torch.zeros(d.k, d.heads, d.new, d.dim, dtype=torch.float64)
    for b in range(d.k):
        keys = torch.cat([prefix_k[0], branch_k[b, :, : lengths[b]]], dim=1).double()  # [Hkv, P+len, D]
        vals = torch.cat([prefix_v[0], branch_v[b, :, : lengths[b]]], dim=1).double()  # [Hkv, P+len, D]
        keys = keys.cpu().repeat_interleave(d.group, dim=0)  # [H, P+len, D]
        vals = vals.cpu().repeat_interleave(d.group, dim=0)  # [H, P+len, D]
        for t in range(d.new):
            qpos = d.prefix + lengths[b] - d.new + t
            visible = [
                j for j in range(d.prefix + lengths[b])
                if (j < d.prefix or j <= qpos) and (sliding_window is None or qpos - j < sliding_window)
            ]
            if not visible:
                continue
            idx = torch.tensor(visible)
            s = (keys[:, idx] @ q[b, :, t].double().cpu().unsqueeze(-1)).squeeze(-1) * scale  # [H, n]
            out[b, :, t] = torch.softmax(s, dim=-1).unsqueeze(1).bmm(vals[:, idx]).squeeze(1)  # [H, D]
    return out
