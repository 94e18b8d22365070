"""Bifurcated attention: one shared prompt prefix, k branches with their own KV.

Reference implementation in plain PyTorch (any device) plus the dispatch to the
Triton kernel (``kernels.triton_bifurcated``) for CUDA tensors.

Layout (see ``bifurcated_attention``):

    q          [k, H, T, D]      the T newest tokens of each of the k branches
    prefix_k/v [1, Hkv, P, D]    shared prompt KV, stored once (P may be 0)
    branch_k/v [k, Hkv, S, D]    per-branch KV buffers, S = allocated capacity
    lengths    [k]               valid entries per branch, the T new ones included

Positions: prefix keys sit at 0..P-1, branch b's entries at P..P+len_b-1, and query t
of branch b at P + len_b - T + t. Query t sees every prefix key and branch keys
j <= len_b - T + t (causal inside the new tokens, ragged across branches).

The attention over (prefix ++ branch) is computed as two pieces merged with their
softmax statistics (log-sum-exp): the prefix piece is ONE batched matmul for all
k*T*(H/Hkv) queries of a KV head against the single copy of the prefix, the branch
piece is a per-branch matmul over at most max(lengths) columns. GQA is handled by
folding the H/Hkv query heads of a KV head into the query rows, never by repeating KV.

Branches with len_b < T: query rows t < T - len_b have no branch key of their own;
their output is "don't care" (they attend to the prefix only, or are 0 when there is
no key at all) but always finite, so they never poison the valid rows. Branch buffer
entries at or beyond len_b are never given weight, but must hold finite numbers
(0 * NaN is NaN in the value product): allocate buffers with zeros, not ``empty``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "bifurcated_attention",
    "reference_bifurcated_attention",
    "replicated_attention",
    "dense_attention",
    "naive_attention",
]


@dataclass(frozen=True)
class Dims:
    """Sizes of one bifurcated-attention call, validated."""

    k: int  # branches
    heads: int  # H, query heads
    new: int  # T, new tokens per branch
    dim: int  # D, head dimension
    kv_heads: int  # Hkv
    prefix: int  # P
    capacity: int  # S

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.heads // self.kv_heads


def check_inputs(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    sliding_window: int | None = None,
) -> Dims:
    """Validate shapes, dtypes and devices (no device sync); return the sizes."""
    if q.dim() != 4:
        raise ValueError(f"q must be [k, H, T, D], got shape {tuple(q.shape)}")
    k, heads, new, dim = q.shape
    if new < 1:
        raise ValueError("q must hold at least one new token per branch (T >= 1)")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        if t.dim() != 4 or t.shape[0] != 1 or t.shape[3] != dim:
            raise ValueError(f"{name} must be [1, Hkv, P, {dim}], got shape {tuple(t.shape)}")
    if prefix_k.shape != prefix_v.shape:
        raise ValueError(f"prefix_k {tuple(prefix_k.shape)} and prefix_v {tuple(prefix_v.shape)} differ")
    kv_heads, prefix = prefix_k.shape[1], prefix_k.shape[2]
    for name, t in (("branch_k", branch_k), ("branch_v", branch_v)):
        if t.dim() != 4 or t.shape[0] != k or t.shape[1] != kv_heads or t.shape[3] != dim:
            raise ValueError(f"{name} must be [{k}, {kv_heads}, S, {dim}], got shape {tuple(t.shape)}")
    if branch_k.shape != branch_v.shape:
        raise ValueError(f"branch_k {tuple(branch_k.shape)} and branch_v {tuple(branch_v.shape)} differ")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"H={heads} query heads must be a multiple of Hkv={kv_heads} KV heads")
    if branch_lengths.shape != (k,) or branch_lengths.dtype.is_floating_point or branch_lengths.dtype == torch.bool:
        raise ValueError(f"branch_lengths must be an integer tensor of shape [{k}], got "
                         f"{branch_lengths.dtype} {tuple(branch_lengths.shape)}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q must be a floating tensor, got {q.dtype}")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v), ("branch_k", branch_k), ("branch_v", branch_v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}, q has {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    if branch_lengths.device != q.device:
        raise ValueError(f"branch_lengths is on {branch_lengths.device}, q on {q.device}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    return Dims(k, heads, new, dim, kv_heads, prefix, branch_k.shape[2])


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax pieces in fp32 for half types (fp64 stays fp64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _softmax_pieces(s: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unnormalized attention of scores ``s`` [B, M, N] (-inf = masked) over ``v`` [B, N, D].

    Returns (acc [B, M, D], m [B, M], l [B, M]) with softmax = acc / l and the row max m
    (-inf on rows with no visible key, where acc = l = 0). ``s`` is overwritten.
    """
    m = s.amax(dim=-1)  # [B, M]
    m_safe = torch.where(m == -math.inf, 0.0, m)  # [B, M]
    p = s.sub_(m_safe.unsqueeze(-1)).exp_()  # [B, M, N]
    l = p.sum(dim=-1)  # [B, M]
    acc = torch.bmm(p, v)  # [B, M, D]
    return acc, m, l


def _prefix_piece(
    q: Tensor, prefix_k: Tensor, prefix_v: Tensor, lengths: list[int], d: Dims, window: int | None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """All k*g*T queries of each KV head against the one copy of the prefix.

    ``q`` is scaled, in compute dtype, [k, H, T, D]. Returns (acc [k, Hkv, g, T, D],
    m [k, Hkv, g, T], l [k, Hkv, g, T]) or None when no prefix key is visible.
    """
    k, hkv, g, t_new, dim, p_len = d.k, d.kv_heads, d.group, d.new, d.dim, d.prefix
    # Query absolute positions and the first prefix key each one may see.
    start = 0
    first_key: Tensor | None = None  # [k, T]
    if window is not None:
        qpos = torch.tensor(lengths, device=q.device).unsqueeze(1) + torch.arange(t_new, device=q.device)
        first_key = qpos + (p_len - t_new - window + 1)  # [k, T]
        start = max(0, min(p_len, min(lengths) + p_len - t_new - window + 1))
    if start >= p_len:
        return None
    rows = k * g * t_new
    qp = q.reshape(k, hkv, g * t_new, dim).transpose(0, 1).reshape(hkv, rows, dim)  # [Hkv, k*g*T, D]
    pk = prefix_k[0, :, start:].to(q.dtype)  # [Hkv, P', D]
    pv = prefix_v[0, :, start:].to(q.dtype)  # [Hkv, P', D]
    s = torch.bmm(qp, pk.transpose(1, 2))  # [Hkv, k*g*T, P']
    if first_key is not None and int(first_key.max()) > start:
        cols = torch.arange(start, p_len, device=q.device)  # [P']
        hidden = cols < first_key.unsqueeze(-1)  # [k, T, P']
        s.view(hkv, k, g, t_new, p_len - start).masked_fill_(hidden[None, :, None], -math.inf)
    acc, m, l = _softmax_pieces(s, pv)  # [Hkv, k*g*T, D], [Hkv, k*g*T] x2
    acc = acc.view(hkv, k, g, t_new, dim).transpose(0, 1)  # [k, Hkv, g, T, D]
    m = m.view(hkv, k, g, t_new).transpose(0, 1)  # [k, Hkv, g, T]
    l = l.view(hkv, k, g, t_new).transpose(0, 1)  # [k, Hkv, g, T]
    return acc, m, l


def _branch_piece(
    q: Tensor, kv_k: Tensor, kv_v: Tensor, lengths: list[int], d: Dims, window: int | None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """Each branch's queries against its own KV, causal, over max(lengths) columns.

    ``q`` is scaled, in compute dtype, [k, H, T, D]; ``kv_k``/``kv_v`` [k, Hkv, >=max(len), D].
    Positions are relative to the first entry of ``kv_k`` (the window only needs differences).
    Returns (acc [k, Hkv, g, T, D], m [k, Hkv, g, T], l [k, Hkv, g, T]) or None if empty.
    """
    k, hkv, g, t_new, dim = d.k, d.kv_heads, d.group, d.new, d.dim
    cols = max(lengths)
    if cols == 0:
        return None
    qb = q.reshape(k * hkv, g * t_new, dim)  # [k*Hkv, g*T, D]
    bk = kv_k[:, :, :cols].to(q.dtype).reshape(k * hkv, cols, dim)  # [k*Hkv, N, D]
    bv = kv_v[:, :, :cols].to(q.dtype).reshape(k * hkv, cols, dim)  # [k*Hkv, N, D]
    s = torch.bmm(qb, bk.transpose(1, 2))  # [k*Hkv, g*T, N]
    qpos = torch.tensor(lengths, device=q.device).unsqueeze(1) + torch.arange(-t_new, 0, device=q.device)  # [k, T]
    j = torch.arange(cols, device=q.device)  # [N]
    hidden = j > qpos.unsqueeze(-1)  # [k, T, N]
    if window is not None:
        hidden |= j <= qpos.unsqueeze(-1) - window
    s.view(k, hkv, g, t_new, cols).masked_fill_(hidden[:, None, None], -math.inf)
    acc, m, l = _softmax_pieces(s, bv)  # [k*Hkv, g*T, D], [k*Hkv, g*T] x2
    return (
        acc.view(k, hkv, g, t_new, dim),  # [k, Hkv, g, T, D]
        m.view(k, hkv, g, t_new),  # [k, Hkv, g, T]
        l.view(k, hkv, g, t_new),  # [k, Hkv, g, T]
    )


def _merge(pieces: list[tuple[Tensor, Tensor, Tensor]], d: Dims, like: Tensor) -> Tensor:
    """Combine unnormalized pieces by their row maxima; rows with no key give 0."""
    if not pieces:
        return torch.zeros(d.k, d.heads, d.new, d.dim, dtype=like.dtype, device=like.device)
    m = pieces[0][1]
    for _, m_i, _ in pieces[1:]:
        m = torch.maximum(m, m_i)  # [k, Hkv, g, T]
    m = torch.where(m == -math.inf, 0.0, m)  # [k, Hkv, g, T]
    num = torch.zeros_like(pieces[0][0])  # [k, Hkv, g, T, D]
    den = torch.zeros_like(m)  # [k, Hkv, g, T]
    for acc_i, m_i, l_i in pieces:
        a = torch.exp(m_i - m)  # [k, Hkv, g, T]; 0 where the piece saw no key
        num += acc_i * a.unsqueeze(-1)
        den += l_i * a
    den = den.clamp_min(torch.finfo(den.dtype).tiny)  # no key at all: 0 / tiny = 0
    out = num / den.unsqueeze(-1)  # [k, Hkv, g, T, D]
    return out.reshape(d.k, d.heads, d.new, d.dim).to(like.dtype)  # [k, H, T, D]


def _lengths_list(branch_lengths: Tensor, capacity: int) -> list[int]:
    lengths = [int(x) for x in branch_lengths.tolist()]
    bad = [x for x in lengths if x < 0 or x > capacity]
    if bad:
        raise ValueError(f"branch_lengths must lie in [0, S={capacity}], got {bad}")
    return lengths


def reference_bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Bifurcated attention in plain PyTorch (any device); see the module docstring.

    Returns [k, H, T, D] in q's dtype; softmax pieces in fp32 for half inputs.
    """
    d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
    lengths = _lengths_list(branch_lengths, d.capacity)
    scale = 1.0 / math.sqrt(d.dim) if scale is None else scale
    qs = q.to(_compute_dtype(q.dtype)) * scale  # [k, H, T, D]
    pieces = []
    if d.prefix > 0:
        piece = _prefix_piece(qs, prefix_k, prefix_v, lengths, d, sliding_window)
        if piece is not None:
            pieces.append(piece)
    piece = _branch_piece(qs, branch_k, branch_v, lengths, d, sliding_window)
    if piece is not None:
        pieces.append(piece)
    return _merge(pieces, d, q)


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
    if q.is_cuda:
        from kernels import triton_bifurcated  # imports cleanly without triton or CUDA

        if triton_bifurcated.TRITON_AVAILABLE:
            return triton_bifurcated.triton_bifurcated_attention(
                q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window
            )
    return reference_bifurcated_attention(
        q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, scale, sliding_window
    )


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Ordinary batched decode attention: each branch owns its whole KV (no shared prefix).

    q [k, H, T, D]; k/v [k, Hkv, N, D] with ``lengths`` [k] valid entries each (the T new
    tokens last); same masking rules as ``bifurcated_attention`` with P = 0. This is what a
    KV cache that replicates the prompt per branch runs each step: the benchmark baseline.
    """
    empty = k.new_empty(1, k.shape[1], 0, k.shape[3])  # [1, Hkv, 0, D]
    return reference_bifurcated_attention(q, empty, empty, k, v, lengths, scale, sliding_window)


def replicated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Same contract as ``bifurcated_attention``, computed by copying the prefix into every
    branch (k copies of the prompt KV) and running ``dense_attention``: the baseline."""
    d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
    full_k = torch.cat([prefix_k.expand(d.k, -1, -1, -1), branch_k], dim=2)  # [k, Hkv, P+S, D]
    full_v = torch.cat([prefix_v.expand(d.k, -1, -1, -1), branch_v], dim=2)  # [k, Hkv, P+S, D]
    return dense_attention(q, full_k, full_v, branch_lengths + d.prefix, scale, sliding_window)


def naive_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Test oracle: per branch and per query, softmax over an explicit list of visible keys,
    KV heads repeated, in float64. Rows with no visible key are 0. Slow; tests only."""
    d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
    lengths = _lengths_list(branch_lengths, d.capacity)
    scale = 1.0 / math.sqrt(d.dim) if scale is None else scale
    out = torch.zeros(d.k, d.heads, d.new, d.dim, dtype=torch.float64)
    for b in range(d.k):
        keys = torch.cat([prefix_k[0], branch_k[b, :, : lengths[b]]], dim=1).double()  # [Hkv, P+len, D]
        vals = torch.cat([prefix_v[0], branch_v[b, :, : lengths[b]]], dim=1).double()  # [Hkv, P+len, D]
        keys = keys.cpu().repeat_interleave(d.group, dim=0)  # [H, P+len, D]
        vals = vals.cpu().repeat_interleave(d.group, dim=0)  # [H, P+len, D]
        for t in range(d.new):
            qpos = d.prefix + lengths[b] - d.new + t
            visible = [
                j for j in range(d.prefix + lengths[b])
                if (j < d.prefix or j <= qpos) and (sliding_window is None or qpos - j < sliding_window)
            ]
            if not visible:
                continue
            idx = torch.tensor(visible)
            s = (keys[:, idx] @ q[b, :, t].double().cpu().unsqueeze(-1)).squeeze(-1) * scale  # [H, n]
            out[b, :, t] = torch.softmax(s, dim=-1).unsqueeze(1).bmm(vals[:, idx]).squeeze(1)  # [H, D]
    return out
