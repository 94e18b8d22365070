"""Bifurcated attention: one shared prompt prefix, k branches with their own KV.

``bifurcated_attention`` picks the implementation: the Triton kernel for CUDA tensors when
triton is installed, else the PyTorch reference. Layout and masking: ``kspec.kernels.contract``.
"""

from __future__ import annotations

from torch import Tensor

from kspec.kernels import triton_bifurcated  # imports cleanly without triton or CUDA
from kspec.kernels.reference import reference_bifurcated_attention

__all__ = ["bifurcated_attention"]


def bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Exact attention of each branch's new tokens over (shared prefix ++ own KV).

    q [k, H, T, D]; prefix_k/v [1, Hkv, P, D]; branch_k/v [k, Hkv, S, D]; branch_lengths [k]
    (valid entries including the T new tokens written at [len-T, len)). ``scale`` defaults to
    1/sqrt(D); ``sliding_window`` W lets a query at position i see keys at i-W+1..i.
    Uses the Triton kernel for CUDA tensors when triton is installed, else the reference.
    Returns [k, H, T, D] in q's dtype.
    """
    if q.is_cuda and triton_bifurcated.TRITON_AVAILABLE:
        return triton_bifurcated.triton_bifurcated_attention(
            q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window
        )
    return reference_bifurcated_attention(
        q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window
    )
