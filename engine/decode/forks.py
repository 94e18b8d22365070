"""Diverse branches that split where the model hesitates, not only at the first token.

Mode "diverse" gives the k branches k different first tokens. Where the model is sure of its
first token (the rest of a half-typed name, the one keyword that fits), the other first tokens
are misspellings: `json.lo|` → `ads(…)`, `ad(…)`, `a(…)`. So only first tokens the model finds
plausible start branches of their own: a token whose probability is at least `min_ratio` of the
likeliest one's. The other branches start like the likeliest one and wait (`LaterForks`): at the
first position of that greedy path where the model finds other tokens plausible, the waiting
branches take them, the likeliest alternative first, one branch each; branches left over wait
for the next such position. A waiting branch that never finds one ends as a copy of the greedy
branch, which deduplication merges: fewer alternatives only where the model sees no other.

A waiting branch decodes one token a round (no drafts): the decision is made on the target's
logits at position 0 of its row, where `SpeculativeRun.accept` applies its constraints. The
forced token keeps its own log-probability (the ranking reads it), not the constraint's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from kspec.engine.decode.branches import Branch


def plausible_first_tokens(logits: Tensor, k: int, banned: frozenset[int], min_ratio: float) -> tuple[Tensor, Tensor, int]:
    """logits [V] -> k first tokens [k] and their log-probabilities [k], and how many of them are
    plausible: distinct tokens, none banned, each at least `min_ratio` times as likely as the best
    (min_ratio 0: the k likeliest, as plain diverse mode); the rows after those repeat the best."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
    allowed = logprobs.clone()
    if banned:
        allowed[torch.tensor(sorted(banned), device=logits.device)] = float("-inf")
    top = allowed.topk(min(k, allowed.shape[-1]))
    floor = top.values[0] + (torch.log(torch.tensor(min_ratio)) if min_ratio > 0 else float("-inf"))
    keep = torch.isfinite(top.values) & (top.values >= floor)  # [k]
    keep[0] = True
    plausible = int(keep.sum())
    tokens = torch.where(keep, top.indices, top.indices[0])  # [k]; keep is a prefix (values sorted)
    return tokens, logprobs[tokens], plausible


@dataclass
class LaterForks:
    """The branches still waiting to split from the greedy path, and the forced tokens of this round."""

    min_ratio: float
    banned: frozenset[int]
    waiting: set[int] = field(default_factory=set)  # branch indices
    taken_logprobs: dict[int, float] = field(default_factory=dict)  # row -> the forced token's own log-probability (this round)
    forked: int = 0  # branches that split after their first token

    def rows(self, live: list[int], branches: list[Branch]) -> set[int]:
        """The rows (of `live`, the branch of each row) that wait and are free to split now."""
        return {row for row, index in enumerate(live) if index in self.waiting and not branches[index].heal_remaining}

    def constrain(self, first: Tensor, live: list[int], branches: list[Branch]) -> Tensor:
        """first [k', V]: position 0's logits of the live rows -> the same with each waiting row that
        splits here made to take its alternative (it becomes the row's argmax)."""
        self.taken_logprobs = {}
        rows = sorted(self.rows(live, branches))
        if not rows:
            return first
        groups: dict[tuple[int, ...], list[int]] = {}
        for row in rows:  # rows on the same path see the same logits and share its alternatives
            groups.setdefault(tuple(branches[live[row]].token_ids), []).append(row)
        first = first.clone()
        for members in groups.values():
            logprobs = torch.log_softmax(first[members[0]].float(), dim=-1)  # [V]
            alternatives = self._alternatives(logprobs, len(members))
            for row, token in zip(members, alternatives):
                first[row, token] = first[row].max() + 1.0
                self.taken_logprobs[row] = float(logprobs[token])
                self.waiting.discard(live[row])
                self.forked += 1
        return first

    def _alternatives(self, logprobs: Tensor, wanted: int) -> list[int]:
        """Up to `wanted` tokens after the likeliest, likeliest first, each plausible and not banned."""
        values, indices = logprobs.topk(min(wanted + 1 + len(self.banned), logprobs.shape[-1]))  # [n]
        floor = float(values[0]) + float(torch.log(torch.tensor(self.min_ratio)))
        out = []
        for value, token in zip(values[1:].tolist(), indices[1:].tolist()):
            if value < floor or len(out) == wanted:
                break
            if token not in self.banned:
                out.append(token)
        return out

    def keep_own_logprobs(self, logprobs: list[list[float]]) -> None:
        """Round's log-probabilities per row: a forced token's is the model's own, not the constraint's."""
        for row, value in self.taken_logprobs.items():
            logprobs[row][0] = value
        self.taken_logprobs = {}
