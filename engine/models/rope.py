"""Rotary position embeddings: inverse frequencies for the scaling variants configs use."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kspec.engine.models.args import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> Tensor:
    """[head_dim/2] float32 inverse frequencies, scaled as the config says; on the CPU, also
    while a model is built on the meta device (a meta op there runs a Python reference that
    imports torch._dynamo: seconds of every engine start)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [D/2]
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    return inv_freq


def _llama3_scaled(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotary_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] -> cos, signed sin [B, T, 1, D] (half-rotation layout, as HF checkpoints use).

    The sin comes with the rotation's sign folded in (-sin on the first half), so that
    `apply_rotary` needs a roll instead of a negation and a concatenation."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, D/2]
    sin = freqs.sin()
    cos = torch.cat((freqs, freqs), dim=-1).cos()  # [B, T, D]
    signed_sin = torch.cat((-sin, sin), dim=-1)  # [B, T, D]
    return cos[:, :, None].to(dtype), signed_sin[:, :, None].to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x [B, T, heads, D] rotated by cos/signed_sin [B, T, 1, D]: x cos + rotate_half(x) sin,
    where rotate_half(x) sin = roll(x, D/2) signed_sin exactly (a sign flip is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
