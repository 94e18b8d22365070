"""Bifurcated attention: one shared prompt prefix, k branches with their own KV.

``bifurcated_attention`` picks the implementation (the order: ``kspec.kernels.paths``): on CUDA,
flash-attn's kernels where installed (``flash_bifurcated``), else the Triton kernel where triton
is installed; on CPU, PyTorch's fused flash-attention kernel (``cpu_fused``); each where it
computes the contract exactly, else the PyTorch reference. Layout and masking: ``kspec.kernels.contract``.
"""

from __future__ import annotations

from torch import Tensor

from kspec.kernels import cpu_fused, flash_bifurcated, triton_bifurcated  # import cleanly without flash-attn, triton or CUDA
from kspec.kernels.contract import BranchLayout, check_inputs, lengths_list
from kspec.kernels.paths import TRITON_DTYPES, Installed, bifurcated_path
from kspec.kernels.reference import reference_bifurcated_attention

__all__ = ["bifurcated_attention"]


def bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor | BranchLayout,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Exact attention of each branch's new tokens over (shared prefix ++ own KV).

    q [k, H, T, D]; prefix_k/v [1, Hkv, P, D]; branch_k/v [k, Hkv, S, D]; branch_lengths [k]
    (valid entries including the T new tokens written at [len-T, len)), or a BranchLayout
    built once for all layers of a forward pass (then nothing here waits on the device).
    ``scale`` defaults to 1/sqrt(D); ``sliding_window`` W lets a query at position i see keys
    at i-W+1..i. Returns [k, H, T, D] in q's dtype.
    """
    lengths = branch_lengths.lengths if isinstance(branch_lengths, BranchLayout) else branch_lengths
    if q.is_cuda:
        path = bifurcated_path("cuda", q.dtype, q.shape[-1], Installed.detect())
        host = branch_lengths.host_lengths if isinstance(branch_lengths, BranchLayout) else None
        fa = flash_bifurcated.load() if path == "flash-attn" else None
        if fa is not None and flash_bifurcated.supports(q, prefix_k.shape[2], host, sliding_window):
            check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, lengths, sliding_window)
            return flash_bifurcated.flash_bifurcated_attention(
                q, prefix_k, prefix_v, branch_k, branch_v, lengths, scale, sliding_window, fa
            )
        if path != "pytorch" and triton_bifurcated.TRITON_AVAILABLE and q.dtype in TRITON_DTYPES:
            return triton_bifurcated.triton_bifurcated_attention(
                q, prefix_k, prefix_v, branch_k, branch_v, lengths, scale, sliding_window
            )
    if q.device.type == "cpu":
        d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, lengths, sliding_window)
        layout = branch_lengths if isinstance(branch_lengths, BranchLayout) else _layout(branch_lengths, d.capacity, d.new, q, sliding_window)
        if max(layout.host_lengths, default=0) > d.capacity:
            raise ValueError(f"branch_lengths must lie in [0, S={d.capacity}], got {list(layout.host_lengths)}")
        if cpu_fused.supports(q, d.prefix, layout, sliding_window):
            return cpu_fused.fused_bifurcated_attention(q, prefix_k, prefix_v, branch_k, branch_v, layout, scale)
    return reference_bifurcated_attention(
        q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window
    )


def _layout(lengths: Tensor, capacity: int, new: int, q: Tensor, sliding_window: int | None) -> BranchLayout:
    return BranchLayout.build(lengths_list(lengths, capacity), new, q.dtype, q.device, sliding_window)
