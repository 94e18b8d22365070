"""Merging two attention halves by their log-sum-exp (the step every bifurcated path ends with).

A half is (out, lse): its softmax-normalised output over the keys it saw and the log of its
softmax denominator, ``lse = log(sum_j exp(s_j))`` over those keys. Over the union of both
key sets the exact output is

    out = (e^lse_a * out_a + e^lse_b * out_b) / (e^lse_a + e^lse_b)

computed here relative to max(lse_a, lse_b) so nothing overflows. A half that saw no key
has lse = -inf (weight 0). FlashAttention 2 reports a row with no visible key as lse = +inf
(and out = 0): ``clean_lse`` turns that into -inf before merging. A row where neither half
saw a key comes out 0, finite (the contract's "don't care" rows).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["clean_lse", "merge_by_lse"]


def clean_lse(lse: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """lse [...] in ``dtype`` with +inf and NaN (FlashAttention's "no key" rows) as -inf."""
    lse = lse.to(dtype)
    return torch.where(torch.isnan(lse) | (lse == math.inf), -math.inf, lse)


def merge_by_lse(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """out_a/out_b [..., D] (any float dtype), lse_a/lse_b [...] -> [..., D] in ``dtype``
    (default out_a's), the exact attention over both halves' keys. Computed in float32
    (float64 when an input is float64)."""
    wide = torch.float64 if torch.float64 in (out_a.dtype, out_b.dtype, lse_a.dtype, lse_b.dtype) else torch.float32
    lse_a, lse_b = clean_lse(lse_a, wide), clean_lse(lse_b, wide)  # [...]
    top = torch.maximum(lse_a, lse_b)  # [...]
    top = torch.where(top == -math.inf, 0.0, top)  # neither half saw a key: both weights 0
    w_a = torch.exp(lse_a - top)  # [...], 0 where half a saw no key
    w_b = torch.exp(lse_b - top)  # [...]
    den = (w_a + w_b).clamp_min(torch.finfo(wide).tiny)  # [...]
    out = (out_a.to(wide) * (w_a / den).unsqueeze(-1)).add_(out_b.to(wide) * (w_b / den).unsqueeze(-1))  # [..., D]
    return out.to(dtype or out_a.dtype)
