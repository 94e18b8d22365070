"""Bifurcated attention as Triton kernels for CUDA (optional extra ``kspec[gpu]``).

Same contract as ``kspec.kernels.bifurcated.bifurcated_attention``. Importing this module never
fails: without triton, ``TRITON_AVAILABLE`` is False and calling the function raises.

Three launches, flash-decoding style (split the keys, merge by log-sum-exp):

1. ``_prefix_kernel``   grid (row blocks, Hkv, prefix splits). The rows of a program are
   queries of *all* branches and all g = H/Hkv heads of one KV head, so every prefix tile is
   read from HBM once per row block, not once per branch (the point of bifurcation).
2. ``_branch_kernel``   grid (row blocks, k*Hkv, branch splits): each branch's g*T queries
   against its own KV, causal inside the T new tokens, stopping at its own length.
3. ``_combine_kernel``  grid (k*H*T,): merges the partial outputs of every split by their
   log-sum-exp and writes [k, H, T, D] in q's dtype.

Partials are fp32: ``o_part`` [n_splits, k*H*T, D] (normalized per split) and ``lse_part``
[n_splits, k*H*T] (-inf where a split saw no key). Scores and softmax are fp32; for half
inputs the probabilities are rounded to q's dtype before the P @ V product (as FlashAttention
does). fp32 inputs use IEEE fp32 dot products (no TF32).

No host synchronization: branch lengths are read on the device and clamped to [0, S]
(out-of-range lengths are not reported on this path, unlike the reference).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kspec.kernels.contract import Dims, check_inputs

try:
    import triton
    import triton.language as tl
except ImportError:  # the optional extra `gpu` is not installed
    triton = None
    tl = None

TRITON_AVAILABLE: bool = triton is not None

__all__ = ["TRITON_AVAILABLE", "triton_bifurcated_attention", "launch", "plan_splits"]

BLOCK_N = 64  # keys per tile (half types); splits are whole multiples of it
BLOCK_N_FP32 = 32  # fp32 tiles are twice the bytes: keep shared memory under ~75 KB
MAX_PREFIX_SPLITS = 64
BRANCH_SPLIT_KEYS = 512  # keys per branch split
MAX_BRANCH_SPLITS = 16


def _block_m(rows: int) -> int:
    """Query rows per program: a power of two in [16, 64] (tl.dot needs >= 16)."""
    return min(64, max(16, 1 << max(0, rows - 1).bit_length()))


def plan_splits(d: Dims, sm_count: int) -> tuple[int, int, int, int]:
    """(prefix_splits, prefix_split_len, branch_splits, branch_split_len) for a call.

    Prefix splits are chosen to give about 4 programs per SM; each split is a whole
    number of key tiles, and no split is empty.
    """
    prefix_splits = prefix_len = 0
    if d.prefix > 0:
        row_blocks = -(-d.k * d.group * d.new // _block_m(d.k * d.group * d.new))
        want = max(1, -(-4 * sm_count // (row_blocks * d.kv_heads)))
        prefix_splits = min(want, MAX_PREFIX_SPLITS, -(-d.prefix // BLOCK_N))
        prefix_len = -(-d.prefix // prefix_splits)
        prefix_len = -(-prefix_len // BLOCK_N) * BLOCK_N
        prefix_splits = -(-d.prefix // prefix_len)
    branch_splits = branch_len = 0
    if d.capacity > 0:
        branch_splits = min(MAX_BRANCH_SPLITS, -(-d.capacity // BRANCH_SPLIT_KEYS))
        branch_len = -(-d.capacity // branch_splits)
        branch_len = -(-branch_len // BLOCK_N) * BLOCK_N
        branch_splits = -(-d.capacity // branch_len)
    return prefix_splits, prefix_len, branch_splits, branch_len


if TRITON_AVAILABLE:

    @triton.jit
    def _prefix_kernel(
        Q, K, V, Lens, OP, LSEP,
        stride_qb, stride_qh, stride_qt, stride_qd,  # q [k, H, T, D]
        stride_kh, stride_kn, stride_kd,  # prefix_k[0] [Hkv, P, D]
        stride_vh, stride_vn, stride_vd,  # prefix_v[0] [Hkv, P, D]
        stride_os, stride_or,  # o_part [n, k*H*T, D] (D contiguous)
        stride_ls,  # lse_part [n, k*H*T] (rows contiguous)
        n_rows, Hkv, P, D, G, T, split_len, window, sm_scale,
        HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        h = tl.program_id(1)  # KV head
        split = tl.program_id(2)
        GT = G * T
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows (branch, group head, token)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < n_rows
        d_mask = offs_d < D
        b = offs_m // GT
        r = offs_m % GT
        head = h * G + r // T  # query head
        t = r % T
        q_ptrs = (Q + b.to(tl.int64)[:, None] * stride_qb + head[:, None] * stride_qh
                  + t[:, None] * stride_qt + offs_d[None, :] * stride_qd)
        q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        length = tl.load(Lens + b, mask=m_mask, other=0).to(tl.int32)  # [BLOCK_M]
        first = P + length - T + t - window + 1  # first visible prefix key (window only)

        lo = split * split_len
        hi = tl.minimum(lo + split_len, P)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = K + h.to(tl.int64) * stride_kh
        v_base = V + h.to(tl.int64) * stride_vh
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < hi
            kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                         mask=n_mask[None, :] & d_mask[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
            s = tl.dot(q, kt, input_precision=PRECISION) * sm_scale  # [BLOCK_M, BLOCK_N]
            visible = n_mask[None, :]
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] >= first[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=n_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        seen = l_i > 0.0
        l_div = tl.where(seen, l_i, 1.0)
        lse = tl.where(seen, m_i + tl.log(l_div), float("-inf"))
        out_row = (b.to(tl.int64) * Hkv + h) * GT + r  # row of [k, H, T] flattened
        tl.store(OP + split * stride_os + out_row[:, None] * stride_or + offs_d[None, :],
                 acc / l_div[:, None], mask=m_mask[:, None] & d_mask[None, :])
        tl.store(LSEP + split * stride_ls + out_row, lse, mask=m_mask)

    @triton.jit
    def _branch_kernel(
        Q, K, V, Lens, OP, LSEP,
        stride_qb, stride_qh, stride_qt, stride_qd,  # q [k, H, T, D]
        stride_kb, stride_kh, stride_kn, stride_kd,  # branch_k [k, Hkv, S, D]
        stride_vb, stride_vh, stride_vn, stride_vd,  # branch_v [k, Hkv, S, D]
        stride_os, stride_or,  # o_part [n, k*H*T, D]
        stride_ls,  # lse_part [n, k*H*T]
        split_offset, Hkv, S, D, G, T, split_len, window, sm_scale,
        HAS_WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)  # branch * Hkv + KV head
        split = tl.program_id(2)
        b = bh // Hkv
        h = bh % Hkv
        GT = G * T
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows (group head, token)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < GT
        d_mask = offs_d < D
        head = h * G + offs_m // T
        t = offs_m % T
        q_ptrs = (Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh
                  + t[:, None] * stride_qt + offs_d[None, :] * stride_qd)
        q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        length = tl.minimum(tl.maximum(tl.load(Lens + b).to(tl.int32), 0), S)
        last = length - T + t  # last visible key of each row (causal), may be < 0
        first = last - window + 1  # first visible key (window only)

        lo = split * split_len
        hi = tl.minimum(lo + split_len, length)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < hi
            kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                         mask=n_mask[None, :] & d_mask[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
            s = tl.dot(q, kt, input_precision=PRECISION) * sm_scale  # [BLOCK_M, BLOCK_N]
            visible = n_mask[None, :] & (offs_n[None, :] <= last[:, None])
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] >= first[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                        mask=n_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        seen = l_i > 0.0
        l_div = tl.where(seen, l_i, 1.0)
        lse = tl.where(seen, m_i + tl.log(l_div), float("-inf"))
        out_row = bh.to(tl.int64) * GT + offs_m  # row of [k, H, T] flattened
        slot = split_offset + split
        tl.store(OP + slot * stride_os + out_row[:, None] * stride_or + offs_d[None, :],
                 acc / l_div[:, None], mask=m_mask[:, None] & d_mask[None, :])
        tl.store(LSEP + slot * stride_ls + out_row, lse, mask=m_mask)

    @triton.jit
    def _combine_kernel(
        OP, LSEP, Out,
        stride_os, stride_or,  # o_part [n, k*H*T, D]
        stride_ls,  # lse_part [n, k*H*T]
        n_splits, D,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        s_mask = offs_s < n_splits
        d_mask = offs_d < D
        lse = tl.load(LSEP + offs_s * stride_ls + row, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
        m = tl.max(lse, 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(lse - m)  # [BLOCK_S], 0 for splits without keys
        o = tl.load(OP + offs_s[:, None] * stride_os + row * stride_or + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
        den = tl.sum(w, 0)
        out = tl.sum(o * w[:, None], 0) / tl.where(den > 0.0, den, 1.0)  # [BLOCK_D]; 0 if no key
        tl.store(Out + row * D + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def triton_bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """``bifurcated_attention`` on CUDA with Triton kernels; returns [k, H, T, D] in q's dtype."""
    if not TRITON_AVAILABLE:
        raise RuntimeError("triton is not installed: pip install 'kspec[gpu]'")
    if not q.is_cuda:
        raise RuntimeError(f"the Triton kernel needs CUDA tensors, q is on {q.device}")
    sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
    return launch(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window, sm_count)


def launch(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None,
    sliding_window: int | None,
    sm_count: int,
) -> Tensor:
    """Run the three kernels on whatever device the tensors are on (CUDA, or CPU under the
    Triton interpreter, ``TRITON_INTERPRET=1``); ``sm_count`` sizes the prefix split."""
    if not TRITON_AVAILABLE:
        raise RuntimeError("triton is not installed: pip install 'kspec[gpu]'")
    d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the Triton kernel supports fp16, bf16 and fp32, got {q.dtype}")
    scale = 1.0 / math.sqrt(d.dim) if scale is None else float(scale)
    rows = d.k * d.heads * d.new
    out = torch.empty(d.k, d.heads, d.new, d.dim, dtype=q.dtype, device=q.device)  # [k, H, T, D]
    p_splits, p_len, b_splits, b_len = plan_splits(d, sm_count)
    n_splits = p_splits + b_splits
    if n_splits == 0 or rows == 0:
        return out.zero_()
    o_part = torch.empty(n_splits, rows, d.dim, dtype=torch.float32, device=q.device)  # [n, k*H*T, D]
    lse_part = torch.empty(n_splits, rows, dtype=torch.float32, device=q.device)  # [n, k*H*T]
    lengths = branch_lengths.contiguous()
    block_d = max(16, triton.next_power_of_2(d.dim))
    has_window = sliding_window is not None
    window = sliding_window if has_window else 0
    fp32 = q.dtype == torch.float32
    common = dict(
        HAS_WINDOW=has_window, BLOCK_N=BLOCK_N_FP32 if fp32 else BLOCK_N, BLOCK_D=block_d,
        PRECISION="ieee", num_warps=4, num_stages=2 if fp32 else 3,
    )
    if p_splits:
        pk, pv = prefix_k[0], prefix_v[0]  # [Hkv, P, D]
        prefix_rows = d.k * d.group * d.new
        block_m = _block_m(prefix_rows)
        grid = (triton.cdiv(prefix_rows, block_m), d.kv_heads, p_splits)
        _prefix_kernel[grid](
            q, pk, pv, lengths, o_part, lse_part,
            *q.stride(), *pk.stride(), *pv.stride(),
            o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            prefix_rows, d.kv_heads, d.prefix, d.dim, d.group, d.new, p_len, window, scale,
            BLOCK_M=block_m, **common,
        )
    if b_splits:
        block_m = _block_m(d.group * d.new)
        grid = (triton.cdiv(d.group * d.new, block_m), d.k * d.kv_heads, b_splits)
        _branch_kernel[grid](
            q, branch_k, branch_v, lengths, o_part, lse_part,
            *q.stride(), *branch_k.stride(), *branch_v.stride(),
            o_part.stride(0), o_part.stride(1), lse_part.stride(0),
            p_splits, d.kv_heads, d.capacity, d.dim, d.group, d.new, b_len, window, scale,
            BLOCK_M=block_m, **common,
        )
    _combine_kernel[(rows,)](
        o_part, lse_part, out,
        o_part.stride(0), o_part.stride(1), lse_part.stride(0),
        n_splits, d.dim,
        BLOCK_S=triton.next_power_of_2(n_splits), BLOCK_D=block_d, num_warps=4,
    )
    return out
