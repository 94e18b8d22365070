"""A round's acceptance for all branches at once, on the logits' device, read back in ONE transfer.

After the target verified every live branch's [last token, d1..dn] (ragged n, padded to T),
each branch accepts its own number of drafts and takes one token of the target's: the
correction at the first rejection, or the bonus token after the last draft. Done per branch
on the host, that is a `.tolist()` / `.item()` per branch and per token, each one waiting for
the device; here the whole round is tensor ops over [k', T, V] and one `.tolist()` of a packed
[k', 1 + 2T] result (counts, tokens, log-probabilities), the round's one synchronisation.

One implementation per rule (the plain greedy oracle lives in tests/unit/decode/test_device_round.py):
- greedy, ``accept_greedy_rows``: the longest run of drafts equal to the target's argmax
  (argmax keeps the first maximum). ``accept_greedy_by_position`` is the same rule evaluated in
  the order a CPU wants it, where the head's many rows are compute and a read into Python costs
  microseconds: the logits position by position, only for the rows whose drafts all matched so
  far; one read per position (tested identical to the rows form).
- ``accept_sampling_rows``: exact speculative sampling (accept d_j with probability
  min(1, p(d_j) / q(d_j)), on the first rejection draw from the normalised max(0, p - q), after
  the last draft draw the bonus from p), vectorised; the uniforms come from the request's CPU
  generator and inverse-CDF draws replace multinomial, so a seed gives the same tokens on any
  device; the CPU runs it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from kspec.engine.decode.sampling import SamplingParams, probabilities
from kspec.engine.models.head_cost import HeadCost
from kspec.kernels.transfer import tensor_to_device, to_device

__all__ = [
    "RoundAcceptance", "pack_drafts", "accept_greedy_rows", "accept_greedy_by_position", "HeadPlan", "accept_sampling_rows", "read_round",
    "accept_drafts",
]  # fmt: skip

REACH_PRIOR = 0.5  # a draft position's reach before the run measured it
REACH_SMOOTHING = 0.3  # weight of the newest round in a position's reach


@dataclass(frozen=True)
class RoundAcceptance:
    """One round on the host: per live branch, the drafts it accepted and the tokens it takes
    (the accepted drafts, then the target's own token), with their log-probabilities."""

    accepted: list[int]
    tokens: list[list[int]]  # accepted[row] + 1 tokens each
    logprobs: list[list[float]]


def pack_drafts(drafts: Sequence[Sequence[int]], width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Ragged drafts -> (tokens [k, width] padded with 0, lengths [k]) on ``device`` (a copy to it, no wait)."""
    rows = [list(d) + [0] * (width - len(d)) for d in drafts]
    tokens = tensor_to_device(torch.tensor(rows, dtype=torch.int64).reshape(len(drafts), width), device)  # [k, W]
    lengths = to_device([len(d) for d in drafts], torch.int64, device)  # [k]
    return tokens, lengths


def _taken(drafts: Tensor, accepted: Tensor, own: Tensor, width: int) -> Tensor:
    """[k, T]: position j < accepted holds draft j, position accepted holds ``own`` [k]; the rest is padding."""
    k, n_draft = drafts.shape
    padded = F.pad(drafts, (0, width - n_draft))  # [k, T]
    j = torch.arange(width, device=drafts.device)  # [T]
    return torch.where(j < accepted[:, None], padded, own[:, None])  # [k, T]


def accept_greedy_rows(drafts: Tensor, lengths: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
    """drafts [k, W], lengths [k], logits [k, T, V] with T >= W + 1 ->
    (accepted [k], taken [k, T]: the accepted drafts then the target's token at index accepted)."""
    choices = logits.argmax(dim=-1)  # [k, T]
    n_draft = drafts.shape[1]
    j = torch.arange(n_draft, device=logits.device)  # [W]
    match = (drafts == choices[:, :n_draft]) & (j < lengths[:, None])  # [k, W]
    accepted = match.long().cumprod(dim=1).sum(dim=1)  # [k]: the leading run of matches
    own = choices.gather(1, accepted[:, None]).squeeze(1)  # [k]
    return accepted, _taken(drafts, accepted, own, logits.shape[1])


def accept_greedy_by_position(
    drafts: Sequence[Sequence[int]], hidden: Tensor, head: Callable[[Tensor], Tensor], first: Callable[[Tensor], Tensor],
    later: Callable[[int, list[int], Tensor], Tensor] | None = None, ahead: int = 0,
) -> RoundAcceptance:
    """Greedy acceptance with the head computed only where it decides something: position 0 of
    every row, then position j + 1 of the rows whose drafts 0..j all equalled the target's argmax
    (a row leaves at its first rejection, or after its last draft with the bonus token). A
    verification of k x (γ + 1) rows where few drafts are accepted takes the head for about k.
    Each call of the head reads all its weights: the first call also computes the next `ahead`
    positions of the rows that drafted there (`HeadPlan` weighs a call against the rows); a row's
    logits do not depend on the others in its call (kspec's kernel), so the tokens are the same.
    hidden [k, T, dim] the target's final hidden states; head: [n, dim] -> logits [n, V];
    first: position 0's logits of every row [k, V] -> the same, constrained (token healing);
    later (optional): (position j > 0, the rows still accepting, their logits there [n, V]) -> the
    same, constrained (a branch waiting to split, engine/decode/forks.py).
    Unconstrained, the tokens of accept_greedy_rows over the whole logits (argmax keeps the first maximum)."""
    k = len(drafts)
    rows = list(range(k))  # the rows whose drafts matched so far
    accepted = [0] * k
    tokens: list[list[int]] = [[] for _ in range(k)]
    logprobs: list[list[float]] = [[] for _ in range(k)]
    computed = _computed_ahead(drafts, hidden, head, ahead)  # position -> (its rows, their logits [n, V])
    for position in range(hidden.shape[1]):
        if position in computed:
            held, all_logits = computed[position]
            logits = all_logits if held == rows else all_logits[[held.index(row) for row in rows]]  # [n, V]
        else:
            logits = head(hidden[rows, position])  # [n, V]
        if position == 0:
            logits = first(logits)
        elif later is not None:
            logits = later(position, rows, logits)
        choices = logits.argmax(dim=-1)  # [n]
        chosen = torch.log_softmax(logits, dim=-1).gather(-1, choices[:, None]).squeeze(-1)  # [n]
        read = torch.stack([choices.double(), chosen.double()]).tolist()  # this position's one read; ids < 2^53
        still = []
        for row, token, logprob in zip(rows, read[0], read[1]):
            tokens[row].append(int(token))
            logprobs[row].append(logprob)
            draft = drafts[row]
            if position < len(draft) and draft[position] == int(token):
                accepted[row] += 1
                still.append(row)
        rows = still
        if not rows:
            break
    return RoundAcceptance(accepted, tokens, logprobs)


def _computed_ahead(
    drafts: Sequence[Sequence[int]], hidden: Tensor, head: Callable[[Tensor], Tensor], ahead: int
) -> dict[int, tuple[list[int], Tensor]]:
    """One call of the head for position 0 of every row and the next `ahead` positions of the
    rows that drafted that far: position -> (its rows, their logits [n, V]). hidden [k, T, dim]."""
    at: list[tuple[int, list[int]]] = [(0, list(range(len(drafts))))]
    for position in range(1, min(ahead + 1, hidden.shape[1])):
        rows = [row for row, draft in enumerate(drafts) if len(draft) >= position]
        if not rows:
            break
        at.append((position, rows))
    states = torch.cat([hidden[rows, position] for position, rows in at]) if len(at) > 1 else hidden[:, 0]  # [n, dim]
    logits = head(states)  # [n, V]
    out, start = {}, 0
    for position, rows in at:
        out[position] = (rows, logits[start : start + len(rows)])
        start += len(rows)
    return out


class HeadPlan:
    """One run's choice of how far each round's first call of the head reaches in
    `accept_greedy_by_position`. Computing position j's rows in the first call costs their rows for
    sure; leaving them out costs another call (`HeadCost`) in the rounds that reach j. Position j
    is taken while `reach(j) x call_ms >= row_ms x rows(j)`, with `reach(j)` the share of the run's
    earlier rounds that reached it (smoothed; `REACH_PRIOR` before any)."""

    def __init__(self, cost: HeadCost | None):
        self.cost = cost  # None: position by position (a head whose row may round by its call)
        self._reach: list[float] = []

    def reach(self, position: int) -> float:
        """The share of rounds that needed `position`'s logits (position >= 1), never above an
        earlier position's."""
        shares = [*self._reach[:position], *[REACH_PRIOR] * max(0, position - len(self._reach))]
        return min(shares)

    def positions(self, lengths: Sequence[int]) -> int:
        """How many positions after the first the round's first call computes, for drafts of
        these lengths (a position's rows: the drafts that long)."""
        if self.cost is None:
            return 0
        ahead, held = 0, len(lengths)  # position 0: every row
        for position in range(1, max(lengths, default=0) + 1):
            rows = sum(1 for length in lengths if length >= position)
            over = self.cost.max_rows is not None and held + rows > self.cost.max_rows
            if over or self.reach(position) * self.cost.call_ms < self.cost.row_ms * rows:
                break
            ahead, held = position, held + rows
        return ahead

    def record(self, lengths: Sequence[int], accepted: Sequence[int]) -> None:
        """A round's drafts' lengths and the drafts each row accepted: position j was reached
        where some row accepted j drafts."""
        deepest, drafted = max(accepted, default=0), max(lengths, default=0)
        self._reach += [REACH_PRIOR] * (drafted - len(self._reach))
        for position in range(1, drafted + 1):
            seen = 1.0 if deepest >= position else 0.0
            self._reach[position - 1] += REACH_SMOOTHING * (seen - self._reach[position - 1])


def _inverse_cdf(dist: Tensor, u: Tensor) -> Tensor:
    """One draw per row of the (unnormalised, non-negative) dist [k, V] with uniforms u [k] -> [k]."""
    cdf = dist.double().cumsum(dim=-1)  # [k, V]
    target = (u.double() * cdf[:, -1])[:, None]  # [k, 1]
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)  # [k]: first cdf > u * total
    return index.clamp_max(dist.shape[-1] - 1)


def accept_sampling_rows(
    drafts: Tensor, lengths: Tensor, q: Tensor | None, p: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Exact speculative sampling for every row at once.

    drafts [k, W], lengths [k]; q [k, W, V] the drafter's distributions (None, or rows of zeros:
    a deterministic draft, q one-hot on its token); p [k, T, V] the target's (T >= W + 1).
    Uniforms are drawn on ``generator``'s device (the CPU) and copied over.
    -> (accepted [k], taken [k, T])."""
    k, n_draft = drafts.shape
    vocab = p.shape[-1]
    u = tensor_to_device(torch.rand(k, n_draft + 1, generator=generator, dtype=torch.float64), p.device)  # [k, W+1]
    if n_draft == 0:  # nothing drafted: every row draws its token from p
        accepted = torch.zeros(k, dtype=torch.int64, device=p.device)
        return accepted, _taken(drafts, accepted, _inverse_cdf(p[:, 0], u[:, 0]), p.shape[1])
    j = torch.arange(n_draft, device=p.device)  # [W]
    p_tok = p[:, :n_draft].gather(-1, drafts[..., None]).squeeze(-1)  # [k, W]
    if q is None:
        given = torch.zeros(k, n_draft, dtype=torch.bool, device=p.device)  # [k, W]
        q_tok = torch.ones_like(p_tok)  # [k, W]: q one-hot on the drafted token
    else:
        given = q.sum(dim=-1) > 0  # [k, W]; rows of zeros: deterministic drafts
        q_tok = torch.where(given, q.gather(-1, drafts[..., None]).squeeze(-1).to(p.dtype), 1.0)  # [k, W]
    keep = (u[:, :n_draft] * q_tok.double() < p_tok.double()) & (j < lengths[:, None])  # [k, W]
    accepted = keep.long().cumprod(dim=1).sum(dim=1)  # [k]
    p_at = p.gather(1, accepted[:, None, None].expand(k, 1, vocab)).squeeze(1)  # [k, V]: p where the row draws
    at = accepted.clamp_max(n_draft - 1)[:, None]  # [k, 1]: the rejected position (rows that draw a bonus ignore it)
    given_at = given.gather(1, at)  # [k, 1]
    residual = p_at.clone()  # [k, V]
    if q is not None:
        q_at = q.gather(1, at[:, :, None].expand(k, 1, vocab)).squeeze(1).to(p.dtype)  # [k, V]
        residual = torch.where(given_at, (p_at - q_at).clamp_min(0.0), residual)  # max(0, p - q)
    token_at = drafts.gather(1, at)  # [k, 1]
    residual.scatter_(1, token_at, torch.where(given_at, residual.gather(1, token_at), 0.0))  # q one-hot: p without its token
    rejected = accepted < lengths  # [k]: draws at a rejection (else the bonus from p)
    empty = residual.sum(dim=-1) <= 0.0  # [k]: p == q there, any draw from p is exact
    dist = torch.where((rejected & ~empty)[:, None], residual, p_at)  # [k, V]
    return accepted, _taken(drafts, accepted, _inverse_cdf(dist, u[:, n_draft]), p.shape[1])


def read_round(accepted: Tensor, taken: Tensor, log_probs: Tensor) -> RoundAcceptance:
    """The round's numbers on the host in ONE transfer: accepted [k], taken [k, T] and the
    log-probabilities of the taken tokens from log_probs [k, T, V]."""
    width = taken.shape[1]
    chosen = log_probs.gather(-1, taken[..., None]).squeeze(-1)  # [k, T]
    packed = torch.cat([accepted[:, None].double(), taken.double(), chosen.double()], dim=1)  # [k, 1 + 2T]; ids < 2^53
    rows = packed.tolist()  # the one synchronisation of the round
    counts = [int(row[0]) for row in rows]
    tokens = [[int(x) for x in row[1 : 2 + n]] for row, n in zip(rows, counts)]
    logprobs = [row[1 + width : 2 + width + n] for row, n in zip(rows, counts)]
    return RoundAcceptance(counts, tokens, logprobs)


def accept_drafts(
    drafts: Sequence[Sequence[int]], qs: Sequence[Tensor | None], logits: Tensor, log_probs: Tensor,
    params: SamplingParams, generator: torch.Generator, greedy_rows: Sequence[bool] = (),
) -> RoundAcceptance:
    """Every live row's acceptance under `params`' rule, as tensor ops on the logits' device and one
    read. drafts: each row's draft tokens; qs: the drafter's distribution [n, V] of each row's
    draft (None: a deterministic draft); logits / log_probs [k', T, V]: the target's, T >= 1 + n.
    greedy_rows (a sampling run): the rows that follow the greedy rule instead (a run's greedy
    branches, `SamplingParams.greedy_branches`); the sampling rule still draws every row's
    uniforms, so the other rows' draws do not depend on which rows are greedy."""
    width = max((len(draft) for draft in drafts), default=0)
    tokens, lengths = pack_drafts(drafts, width, logits.device)  # [k', W], [k']
    if params.greedy:
        accepted, taken = accept_greedy_rows(tokens, lengths, logits[:, : width + 1])
    else:
        q = None
        if any(row_q is not None for row_q in qs):
            q = torch.stack([
                F.pad(row_q.to(logits.device), (0, 0, 0, width - row_q.shape[0])) if row_q is not None
                else logits.new_zeros(width, logits.shape[-1])
                for row_q in qs
            ])  # [k', W, V]; zero rows: deterministic drafts
        p = probabilities(logits[:, : width + 1], params)  # [k', W+1, V]
        accepted, taken = accept_sampling_rows(tokens, lengths, q, p, generator)
        if any(greedy_rows):
            rows = to_device(list(greedy_rows), torch.bool, logits.device)  # [k']
            greedy_accepted, greedy_taken = accept_greedy_rows(tokens, lengths, logits[:, : width + 1])
            accepted = torch.where(rows, greedy_accepted, accepted)
            taken = torch.where(rows[:, None], greedy_taken, taken)
    return read_round(accepted, taken, log_probs[:, : width + 1])
