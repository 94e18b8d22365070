"""Bifurcated attention on CPU from PyTorch's fused flash-attention kernel (layout and masking
rules: ``kspec.kernels.contract``).

Two calls of ``aten._scaled_dot_product_flash_attention_for_cpu``, which returns each row's
log-sum-exp next to its output and handles GQA without repeating KV:

- prefix piece: the queries of all k branches, as the rows of ONE batch, against the single
  copy of the prefix;
- branch piece: each branch's queries against its own entries (the layout's mask: causal
  inside the new tokens, ragged lengths);

merged by their log-sum-exp: out = lerp(branch, prefix, sigmoid(lse_prefix - lse_branch)).
A handful of fused ops per layer instead of the reference's ~30, and nothing that waits on a
device. Cases the flash kernel cannot express (a sliding window that hides prefix keys, a
branch with fewer entries than new tokens) stay with the reference: see ``supports``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kspec.kernels.contract import BranchLayout

__all__ = ["fused_bifurcated_attention", "supports"]


def supports(q: Tensor, prefix_len: int, layout: BranchLayout, sliding_window: int | None) -> bool:
    """Whether this implementation computes the contract exactly for these inputs."""
    if q.device.type != "cpu" or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return False
    if min(layout.host_lengths) < layout.new:  # a query with no branch key of its own
        return False
    window_hides_prefix = sliding_window is not None and prefix_len + max(layout.host_lengths) > sliding_window
    return not window_hides_prefix


def fused_bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    layout: BranchLayout,
    scale: float | None = None,
) -> Tensor:
    """q [k, H, T, D]; prefix_k/v [1, Hkv, P, D]; branch_k/v [k, Hkv, S, D] -> [k, H, T, D].
    Call only where ``supports`` says so (shapes were checked by the dispatcher)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    # the flash kernel reads rows as contiguous vectors: a strided last dimension gives wrong results
    q, prefix_k, prefix_v, branch_k, branch_v = (_unit_stride(t) for t in (q, prefix_k, prefix_v, branch_k, branch_v))
    k, heads, new, dim = q.shape
    cols = max(layout.host_lengths)
    out_b, lse_b = flash(q, branch_k[:, :, :cols], branch_v[:, :, :cols], attn_mask=layout.branch_mask, scale=scale)
    # out_b [k, H, T, D], lse_b [k, H, T]
    if prefix_k.shape[2] == 0:
        return out_b
    rows = q.transpose(0, 1).reshape(1, heads, k * new, dim)  # [1, H, k*T, D]: every branch's queries
    out_p, lse_p = flash(rows, prefix_k, prefix_v, scale=scale)  # [1, H, k*T, D], [1, H, k*T]
    out_p = out_p.view(heads, k, new, dim).transpose(0, 1)  # [k, H, T, D]
    lse_p = lse_p.view(heads, k, new).transpose(0, 1)  # [k, H, T]
    prefix_share = torch.sigmoid(lse_p - lse_b).unsqueeze(-1)  # e^lse_p / (e^lse_p + e^lse_b), [k, H, T, 1]
    return torch.lerp(out_b, out_p, prefix_share.to(out_b.dtype))  # [k, H, T, D]


def _unit_stride(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()
