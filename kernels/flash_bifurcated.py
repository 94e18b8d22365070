"""Attention through FlashAttention 2's CUDA kernels (the optional package ``flash-attn``):
prefill over a KV cache and both halves of bifurcated attention (layout and masking rules:
``kspec.kernels.contract``).

Importing this module never imports flash-attn; ``load()`` does, once, and returns None when
it is missing, fails to import (no CUDA build for this machine) or lacks what is used here:
``flash_attn_func`` (with ``return_attn_probs``, which also returns each row's log-sum-exp) and
``flash_attn_with_kvcache`` (with ``return_softmax_lse``, flash-attn >= 2.6).

Bifurcated attention is two kernel calls and one merge, nothing that waits on the device:

- prefix half: ``flash_attn_func`` with the queries of all k branches, and the g = H/Hkv query
  heads of each KV head, as the rows of ONE sequence per KV head, against the single copy of
  the prefix (not causal: every query sees every prefix key). Each prefix tile is read once
  per row block, not once per branch or per query head; KV heads are never repeated.
- branch half: ``flash_attn_with_kvcache`` over each branch's own buffer with
  ``cache_seqlens`` = the branch lengths (read on the device), causal: flash-attn aligns the
  causal mask to the bottom right, so query t of branch b sees entries j <= len_b - T + t,
  exactly the contract's rule; a sliding window W is ``window_size=(W - 1, 0)``.
- merged by log-sum-exp (``kspec.kernels.lse_merge``), as the reference merges its pieces.

The kernels' tensors are [B, T, H, D] (ours [B, H, T, D]): transposed views are passed as
they are (flash-attn takes any strides with a unit last one), nothing is copied.

Functions take the module as ``fa`` so tests can run the glue against a stand-in on CPU.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from types import ModuleType
from typing import Sequence

import torch
from torch import Tensor

from kspec.kernels.lse_merge import merge_by_lse

__all__ = ["load", "supports", "supports_prefill", "flash_bifurcated_attention", "flash_cache_attention"]

DTYPES = (torch.float16, torch.bfloat16)  # what FlashAttention 2 computes
MAX_HEAD_DIM = 256


@functools.lru_cache(maxsize=1)
def load() -> ModuleType | None:
    """The flash_attn module when it is installed, imports and has the API used here; else None."""
    try:
        module = importlib.import_module("flash_attn")
    except Exception:  # not installed, or built for another CUDA / torch: not usable
        return None
    return module if has_api(module) else None


def has_api(module: ModuleType) -> bool:
    """Whether ``module`` offers flash_attn_func and flash_attn_with_kvcache(return_softmax_lse=...)."""
    func, kvcache = getattr(module, "flash_attn_func", None), getattr(module, "flash_attn_with_kvcache", None)
    if not callable(func) or not callable(kvcache):
        return False
    try:
        return "return_softmax_lse" in inspect.signature(kvcache).parameters
    except (TypeError, ValueError):
        return False


def _shape_ok(q: Tensor) -> bool:
    dim = q.shape[-1]
    return q.dtype in DTYPES and dim % 8 == 0 and dim <= MAX_HEAD_DIM


def supports_prefill(q: Tensor) -> bool:
    """Whether the cache attention below computes this call (CUDA, fp16/bf16, D % 8 == 0, D <= 256)."""
    return q.is_cuda and _shape_ok(q)


def supports(q: Tensor, prefix_len: int, host_lengths: Sequence[int] | None, sliding_window: int | None) -> bool:
    """Whether the bifurcated path computes the contract exactly for these inputs. A sliding
    window that hides prefix keys (positions differ per branch) is not expressible by one call
    over the shared prefix; without host lengths a window is assumed to."""
    if not (q.is_cuda and _shape_ok(q)):
        return False
    if sliding_window is None or prefix_len == 0:
        return True
    return host_lengths is not None and prefix_len + max(host_lengths, default=0) <= sliding_window


def _window(sliding_window: int | None) -> tuple[int, int]:
    return (-1, -1) if sliding_window is None else (sliding_window - 1, 0)


def flash_bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None,
    sliding_window: int | None,
    fa: ModuleType,
) -> Tensor:
    """q [k, H, T, D]; prefix_k/v [1, Hkv, P, D]; branch_k/v [k, Hkv, S, D]; branch_lengths [k]
    on q's device (entries per branch, the T new ones included) -> [k, H, T, D] in q's dtype.
    Call where ``supports`` says so; shapes are checked by the dispatcher."""
    k, heads, new, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    q_rows = q.transpose(1, 2)  # [k, T, H, D]
    out_b, lse_b = fa.flash_attn_with_kvcache(
        q_rows,
        branch_k.transpose(1, 2),  # [k, S, Hkv, D]
        branch_v.transpose(1, 2),  # [k, S, Hkv, D]
        cache_seqlens=branch_lengths.to(torch.int32),  # [k]
        softmax_scale=scale,
        causal=True,
        window_size=_window(sliding_window),
        return_softmax_lse=True,
    )  # out_b [k, T, H, D], lse_b [k, H, T]
    if prefix_k.shape[2] == 0:
        return out_b.transpose(1, 2)  # [k, H, T, D]; rows with no key are 0
    kv_heads = prefix_k.shape[1]
    group = heads // kv_heads
    rows = q.reshape(k, kv_heads, group, new, dim).permute(0, 2, 3, 1, 4).reshape(1, k * group * new, kv_heads, dim)
    # rows [1, k*g*T, Hkv, D]: every branch's queries, and the g query heads of each KV head, as the rows of
    # ONE sequence per KV head, so the kernel reads each prefix tile once for all of them
    out_p, lse_p, _ = fa.flash_attn_func(
        rows,
        prefix_k.transpose(1, 2),  # [1, P, Hkv, D]
        prefix_v.transpose(1, 2),  # [1, P, Hkv, D]
        softmax_scale=scale,
        causal=False,
        return_attn_probs=True,
    )  # out_p [1, k*g*T, Hkv, D], lse_p [1, Hkv, k*g*T]
    out_p = out_p.reshape(k, group, new, kv_heads, dim).permute(0, 3, 1, 2, 4).reshape(k, heads, new, dim)  # [k, H, T, D]
    lse_p = lse_p.reshape(kv_heads, k, group, new).transpose(0, 1).reshape(k, heads, new)  # [k, H, T]
    return merge_by_lse(out_p, lse_p, out_b.transpose(1, 2), lse_b, q.dtype)  # [k, H, T, D]


def flash_cache_attention(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    kv_len: int,
    row_ends: Tensor | None,
    scale: float | None,
    sliding_window: int | None,
    fa: ModuleType,
) -> Tensor:
    """Causal attention of T new tokens per row over a KV cache (prefill, chunked prefill, a
    decode step of a plain batch): q [B, H, T, D], keys/values [B, Hkv, C, D] with the new
    entries written. Every row ends at ``kv_len`` (``row_ends`` None: ``flash_attn_func`` over
    [0, kv_len)), or row b ends at row_ends[b] (a device tensor [B]: ragged rows,
    ``flash_attn_with_kvcache`` with those lengths). Query t of a row sees its keys up to
    end - T + t (bottom-right causal) within the window. -> [B, H, T, D] in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q_rows = q.transpose(1, 2)  # [B, T, H, D]
    if row_ends is None:
        out = fa.flash_attn_func(
            q_rows,
            keys[:, :, :kv_len].transpose(1, 2),  # [B, kv_len, Hkv, D]
            values[:, :, :kv_len].transpose(1, 2),
            softmax_scale=scale,
            causal=True,
            window_size=_window(sliding_window),
        )  # [B, T, H, D]
    else:
        out = fa.flash_attn_with_kvcache(
            q_rows,
            keys.transpose(1, 2),  # [B, C, Hkv, D]
            values.transpose(1, 2),
            cache_seqlens=row_ends.to(torch.int32),  # [B]
            softmax_scale=scale,
            causal=True,
            window_size=_window(sliding_window),
        )  # [B, T, H, D]
    return out.transpose(1, 2)  # [B, H, T, D]
