"""Bifurcated attention in plain PyTorch, any device: the reference every kernel is checked
against (layout and masking rules: ``kspec.kernels.contract``).

The attention over (prefix ++ branch) is computed as two pieces merged with their
softmax statistics (log-sum-exp): the prefix piece is ONE batched matmul for all
k*T*(H/Hkv) queries of a KV head against the single copy of the prefix, the branch
piece is a per-branch matmul over at most max(lengths) columns. GQA is handled by
folding the H/Hkv query heads of a KV head into the query rows, never by repeating KV.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kspec.kernels.contract import BranchLayout, Dims, check_inputs, compute_dtype, lengths_list
from kspec.kernels.transfer import to_device

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
        qpos = to_device(lengths, torch.int64, q.device).unsqueeze(1) + torch.arange(t_new, device=q.device)
        first_key = qpos + (p_len - t_new - window + 1)  # [k, T]
        start = max(0, min(p_len, min(lengths) + p_len - t_new - window + 1))
    if start >= p_len:
        return None
    rows = k * g * t_new
    qp = q.reshape(k, hkv, g * t_new, dim).transpose(0, 1).reshape(hkv, rows, dim)  # [Hkv, k*g*T, D]
    pk = prefix_k[0, :, start:].to(q.dtype)  # [Hkv, P', D]
    pv = prefix_v[0, :, start:].to(q.dtype)  # [Hkv, P', D]
    s = torch.bmm(qp, pk.transpose(1, 2))  # [Hkv, k*g*T, P']
    if first_key is not None and max(lengths) + p_len - window > start:  # = first_key.max(), from the host
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
    qpos = to_device(lengths, torch.int64, q.device).unsqueeze(1) + torch.arange(-t_new, 0, device=q.device)  # [k, T]
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

def reference_bifurcated_attention(
    q: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    branch_k: Tensor,
    branch_v: Tensor,
    branch_lengths: Tensor | BranchLayout,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> Tensor:
    """Bifurcated attention in plain PyTorch (any device); see the module docstring.
    branch_lengths: [k], or a BranchLayout (its host lengths: no device sync).

    Returns [k, H, T, D] in q's dtype; softmax pieces in fp32 for half inputs.
    """
    if isinstance(branch_lengths, BranchLayout):
        d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths.lengths, sliding_window)
        lengths = list(branch_lengths.host_lengths)
    else:
        d = check_inputs(q, prefix_k, prefix_v, branch_k, branch_v, branch_lengths, sliding_window)
        lengths = lengths_list(branch_lengths, d.capacity)
    scale = 1.0 / math.sqrt(d.dim) if scale is None else scale
    qs = q.to(compute_dtype(q.dtype)) * scale  # [k, H, T, D]
    pieces = []
    if d.prefix > 0:
        piece = _prefix_piece(qs, prefix_k, prefix_v, lengths, d, sliding_window)
        if piece is not None:
            pieces.append(piece)
    piece = _branch_piece(qs, branch_k, branch_v, lengths, d, sliding_window)
    if piece is not None:
        pieces.append(piece)
    return _merge(pieces, d, q)
