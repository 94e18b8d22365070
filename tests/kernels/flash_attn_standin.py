"""A stand-in for the ``flash_attn`` package on CPU (tests only): the two functions
kspec.kernels.flash_bifurcated calls, in float64, with the behaviour flash-attn 2 documents:

- tensors [B, T, H, D], K/V with fewer heads for GQA (query head h reads KV head h // (H/Hkv));
- ``causal`` aligned to the bottom right (query i sees keys j <= i + Tk - Tq);
- ``window_size=(left, right)``: keys in [i + Tk - Tq - left, i + Tk - Tq + right], -1 = unbounded;
- log-sum-exp [B, H, Tq] in float32; a row with no visible key: output 0 and lse = +inf
  (what FlashAttention 2's non-split kernel writes);
- ``flash_attn_with_kvcache``: row b's keys are the first ``cache_seqlens[b]`` of its cache.

It lets the glue (layouts, transposes, GQA, the merge) be checked here; the real kernels are
checked against the reference where flash-attn and a GPU are (test_flash_attn.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _attend(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, window: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """One sequence: q [Tq, H, D], k/v [Tk, Hkv, D] -> out [Tq, H, D] float64, lse [H, Tq] float64."""
    t_q, heads, _ = q.shape
    t_k, kv_heads, _ = k.shape
    group = heads // kv_heads
    kk = k.double().repeat_interleave(group, dim=1)  # [Tk, H, D]
    vv = v.double().repeat_interleave(group, dim=1)  # [Tk, H, D]
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale  # [H, Tq, Tk]
    i = torch.arange(t_q)[:, None] + (t_k - t_q)  # [Tq, 1]: the query's own position among the keys
    j = torch.arange(t_k)[None, :]  # [1, Tk]
    visible = torch.ones(t_q, t_k, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window[0] >= 0:
        visible &= j >= i - window[0]
    if window[1] >= 0:
        visible &= j <= i + window[1]
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # [H, Tq], -inf for empty rows
    p = torch.exp(s - torch.where(lse == -math.inf, 0.0, lse)[..., None])  # [H, Tq, Tk]
    out = torch.einsum("hqk,khd->qhd", p, vv)  # [Tq, H, D]
    return out, torch.where(lse == -math.inf, math.inf, lse)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):  # fmt: skip
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    outs, lses = zip(*(_attend(q[b], k[b], v[b], scale, causal, window_size) for b in range(q.shape[0])))
    out = torch.stack(outs).to(q.dtype).contiguous()  # [B, Tq, H, D]
    lse = torch.stack(lses).float().contiguous()  # [B, H, Tq]
    return (out, lse, None) if return_attn_probs else out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):  # fmt: skip
    assert k is None and v is None and cache_seqlens is not None and cache_seqlens.dtype == torch.int32
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    ends = cache_seqlens.tolist()
    outs, lses = zip(*(
        _attend(q[b], k_cache[b, : ends[b]], v_cache[b, : ends[b]], scale, causal, window_size) for b in range(q.shape[0])
    ))
    out = torch.stack(outs).to(q.dtype).contiguous()  # [B, Tq, H, D]
    lse = torch.stack(lses).float().contiguous()  # [B, H, Tq]
    return (out, lse) if return_softmax_lse else out
