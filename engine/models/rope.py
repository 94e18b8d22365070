"""Rotary position embeddings: inverse frequencies for the scaling variants configs use."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kspec.engine.models.args import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> Tensor:
    """[head_dim/2] float32 inverse frequencies, scaled as the config says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
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
    """positions [B, T] -> cos, sin [B, 1, T, D] (half-rotation layout, as HF checkpoints use)."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, D/2]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D] rotated by cos/sin [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
