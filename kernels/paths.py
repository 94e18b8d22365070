"""Which attention implementation runs where: one rule, used by the dispatchers and shown to
users (``$/kspec/status``, ``kspec complete --json``).

Bifurcated attention (decode / verify over the shared prefix), in order of preference:

- CUDA: ``flash-attn`` (FlashAttention 2's kernels, ``kernels/flash_bifurcated.py``; fp16/bf16,
  head dim a multiple of 8 up to 256), then ``triton`` (``kernels/triton_bifurcated.py``;
  fp16/bf16/fp32), then ``pytorch`` (the reference: matmuls and the log-sum-exp merge; PyTorch's
  public SDPA returns no log-sum-exp, so the halves could not be merged through it);
- CPU: ``cpu-fused`` (PyTorch's fused CPU flash kernel, ``kernels/cpu_fused.py``), else ``pytorch``.

Prefill (and plain-batch steps over a ragged cache): ``flash-attn`` on CUDA where it applies,
else ``sdpa`` (``torch.nn.functional.scaled_dot_product_attention``).

A path named here is the one a call takes unless that call's inputs fall outside what the path
computes exactly (e.g. a sliding window that hides prefix keys); such a call takes the next one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["Installed", "bifurcated_path", "prefill_path", "attention_paths"]

FLASH_DTYPES = (torch.float16, torch.bfloat16)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CPU_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Installed:
    """The optional kernels this process can use."""

    flash_attn: bool = False
    triton: bool = False
    cpu_fused: bool = True  # aten._scaled_dot_product_flash_attention_for_cpu

    @classmethod
    def detect(cls) -> "Installed":
        """What this process has (looked up once: the dispatcher asks on every call)."""
        return _detected()


@functools.lru_cache(maxsize=1)
def _detected() -> Installed:
    from kspec.kernels import flash_bifurcated, triton_bifurcated

    return Installed(
        flash_attn=flash_bifurcated.load() is not None,
        triton=triton_bifurcated.TRITON_AVAILABLE,
        cpu_fused=hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
    )


def _flash_fits(dtype: torch.dtype, head_dim: int) -> bool:
    return dtype in FLASH_DTYPES and head_dim % 8 == 0 and head_dim <= 256


def bifurcated_path(device_type: str, dtype: torch.dtype, head_dim: int, installed: Installed) -> str:
    """'flash-attn', 'triton', 'cpu-fused' or 'pytorch' for tensors of this device type and dtype."""
    if device_type == "cuda":
        if installed.flash_attn and _flash_fits(dtype, head_dim):
            return "flash-attn"
        if installed.triton and dtype in TRITON_DTYPES:
            return "triton"
        return "pytorch"
    if device_type == "cpu" and installed.cpu_fused and dtype in CPU_FUSED_DTYPES:
        return "cpu-fused"
    return "pytorch"


def prefill_path(device_type: str, dtype: torch.dtype, head_dim: int, installed: Installed) -> str:
    """'flash-attn' or 'sdpa'."""
    if device_type == "cuda" and installed.flash_attn and _flash_fits(dtype, head_dim):
        return "flash-attn"
    return "sdpa"


def attention_paths(device: torch.device | str, dtype: torch.dtype, head_dim: int, installed: Installed | None = None) -> dict[str, str]:
    """What a model on ``device`` in ``dtype`` runs: {"prefill": ..., "decode": ...}."""
    kind = torch.device(device).type
    found = installed if installed is not None else Installed.detect()
    return {"prefill": prefill_path(kind, dtype, head_dim, found), "decode": bifurcated_path(kind, dtype, head_dim, found)}
