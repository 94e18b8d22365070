"""Token choice from logits: greedy, temperature, top-p; seeded."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    # with temperature > 0: this many leading branches (branch 0 first) are decoded greedily, the
    # others sampled; so the top suggestion stays the model's likeliest line while the others vary
    greedy_branches: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.greedy_branches < 0:
            raise ValueError(f"greedy_branches must be >= 0, got {self.greedy_branches}")

    @property
    def greedy(self) -> bool:
        """Every branch greedy."""
        return self.temperature == 0.0

    def greedy_branch(self, index: int) -> bool:
        """Whether branch `index` takes the argmax (the run greedy, or one of its leading greedy branches)."""
        return self.greedy or index < self.greedy_branches

    def of_branch(self, index: int) -> "SamplingParams":
        """Branch `index`'s own rule, for a choice made for it alone: greedy, or the run's sampling."""
        if self.greedy_branch(index):
            return SamplingParams(0.0, seed=self.seed)
        return replace(self, greedy_branches=0)


def probabilities(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> the distribution tokens are drawn from [..., V] (temperature + top-p)."""
    probs = torch.softmax(logits.float() / max(params.temperature, 1e-6), dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)
        drop = cumulative - sorted_probs > params.top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def choose_tokens(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """logits [B, V] -> (tokens [B], model log-probabilities of those tokens at temperature 1 [B]).
    Rows < params.greedy_branches take the argmax (every row draws, so the generator moves alike)."""
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)
    else:
        tokens = torch.multinomial(probabilities(logits, params), 1, generator=generator).squeeze(-1)
        if params.greedy_branches:
            rows = torch.arange(logits.shape[0], device=logits.device) < params.greedy_branches  # [B]
            tokens = torch.where(rows, logits.argmax(dim=-1), tokens)
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs


def distinct_first_tokens(logits: Tensor, k: int, banned: frozenset[int]) -> tuple[Tensor, Tensor]:
    """logits [V] (may hold -inf) -> the k most likely tokens, none banned (e.g. end-of-text) [k],
    and their log-probabilities [k]. With fewer than k allowed tokens the best one repeats."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
    allowed = logprobs.clone()
    if banned:
        allowed[torch.tensor(sorted(banned), device=logits.device)] = float("-inf")
    top = allowed.topk(min(k, allowed.shape[-1]))
    tokens = torch.where(torch.isfinite(top.values), top.indices, top.indices[0])  # fewer than k allowed: repeat the best
    return tokens, logprobs[tokens]


def first_tokens(
    logits: Tensor, params: SamplingParams, generator: torch.Generator | None, diverse: bool, banned: frozenset[int]
) -> tuple[Tensor, Tensor]:
    """The k branches' first tokens from logits [k, V] (all rows alike): the k most likely
    distinct ones (diverse), else drawn per `params`. -> tokens [k], log-probabilities [k]."""
    if diverse:
        return distinct_first_tokens(logits[0], logits.shape[0], banned)
    return choose_tokens(logits, params, generator)
