"""Regular batched decoding of k sequences from one prompt: the baseline every speed-up
is measured against. The prompt is prefilled once at batch 1, its KV copied once into
k preallocated rows, then each step feeds k tokens and writes their KV by index."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.api import CancelToken
from engine.healing import HealingBias, consume
from engine.kv import BranchKVCache, KVCache, RaggedKVCache
from engine.prefix_cache import Prefill, prefill_uncached
from engine.models.transformer import Transformer
from engine.sampling import SamplingParams, choose_tokens, first_tokens
from engine.stopping import StopRule
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class Branch:
    """One of the k sequences: its tokens, text, and why it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "", "stop", "eos", "length", "deadline", "cancelled"
    heal_remaining: str = ""  # healed prompt text this branch has yet to regenerate

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def logprob(self) -> float:
        return float(sum(self.logprobs))


@dataclass(frozen=True)
class DecodeLimits:
    max_new_tokens: int = 48
    deadline: float | None = None  # time.monotonic() value
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens
    clock: Callable[[], float] = time.monotonic  # what the deadline is compared with

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class DecodeOutput:
    branches: list[Branch]
    prefill_ms: float
    decode_ms: float
    steps: int


class BranchTracker:
    """Applies a token to a branch: detokenize, stop rules, EOS, budget.

    `healed_text` (token healing) is text the first generated token must start with; it
    was already in the document, so it is not part of the branch's visible text."""

    def __init__(
        self, tokenizer: Tokenizer, rule: StopRule, limits: DecodeLimits, prompt_ids: list[int], healed_text: str = ""
    ):
        self.tokenizer, self.rule, self.limits = tokenizer, rule, limits
        self.prompt_ids = prompt_ids
        self.healed_text = healed_text

    def constrain(self, logits: torch.Tensor, branches: list[Branch], healing: HealingBias) -> torch.Tensor:
        """logits [k, V] with rows still regenerating healed text restricted to agreeing tokens."""
        if not any(branch.heal_remaining for branch in branches):
            return logits
        biases = [healing(b.heal_remaining) if b.heal_remaining else torch.zeros_like(logits[0]) for b in branches]
        return logits + torch.stack(biases)  # [k, V]

    def new_detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.prompt_ids)

    def push(self, branch: Branch, detok: IncrementalDetokenizer, token: int, logprob: float) -> None:
        if branch.done:
            return
        if token in self.tokenizer.stop_ids and not self.limits.ignore_eos:
            branch.finish_reason = "eos"
            return
        branch.token_ids.append(token)
        branch.logprobs.append(logprob)
        if branch.heal_remaining:
            branch.heal_remaining = consume(branch.heal_remaining, self.tokenizer.token_texts()[token])
        piece = detok.push(token)
        if piece:
            text, stopped = self.rule.cut(detok.text[len(self.healed_text) :])
            branch.text = text
            if stopped:
                branch.finish_reason = "stop"
                return
        if len(branch.token_ids) >= self.limits.max_new_tokens:
            branch.finish_reason = "length"


def decode_regular(
    model: Transformer,
    tracker: BranchTracker,
    k: int,
    params: SamplingParams,
    cancel: CancelToken | None = None,
    diverse: bool = False,
    prefill: Prefill | None = None,
    shared_prefix: bool = True,
) -> DecodeOutput:
    """k sequences from `tracker.prompt_ids`, one token per sequence per step.

    The prompt's KV comes from `prefill` (e.g. from the prefix cache) or is computed once
    at batch 1. shared_prefix: branches attend over one stored copy of it (bifurcated
    attention); False copies it into k rows (the replicated baseline).
    diverse: the k branches start from the k most likely distinct first tokens, then
    continue with `params` (greedy when its temperature is 0)."""
    prompt_ids = tracker.prompt_ids
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    limits = tracker.limits
    generator = torch.Generator().manual_seed(params.seed)
    started = time.perf_counter()
    with torch.inference_mode():
        if prefill is None:
            prefill = prefill_uncached(model, prompt_ids)
        cache = _branch_cache(prefill.cache, k, limits.max_new_tokens + 1, shared_prefix)
        logits = prefill.last_logits[None].expand(k, -1)  # [k, V]
        prefill_ms = (time.perf_counter() - started) * 1000
        healing = HealingBias(tracker.tokenizer, logits.shape[-1], logits.device)
        branches = [Branch(heal_remaining=tracker.healed_text) for _ in range(k)]
        detoks = [tracker.new_detokenizer() for _ in range(k)]
        steps = 0
        while True:
            logits = tracker.constrain(logits, branches, healing)
            if steps == 0:
                tokens, logprobs = first_tokens(logits, params, generator, diverse, tracker.tokenizer.stop_ids)  # [k], [k]
            else:
                tokens, logprobs = choose_tokens(logits, params, generator)  # [k], [k]
            for branch, detok, token, logprob in zip(branches, detoks, tokens.tolist(), logprobs.tolist()):
                tracker.push(branch, detok, token, logprob)
            if all(b.done for b in branches):
                break
            if _interrupted(branches, limits, cancel):
                break
            steps += 1
            logits = model.step(tokens[:, None], cache)  # [k, V]
    decode_ms = (time.perf_counter() - started) * 1000 - prefill_ms
    return DecodeOutput(branches, prefill_ms, decode_ms, steps)


def _branch_cache(prompt: RaggedKVCache, k: int, new_tokens: int, shared_prefix: bool) -> KVCache:
    if shared_prefix:
        return BranchKVCache.from_prompt(prompt, k, new_tokens)
    replicated = RaggedKVCache(prompt.shape, k, prompt.lengths[0] + new_tokens, prompt.keys.dtype, prompt.keys.device)
    length = prompt.lengths[0]
    replicated.keys[:, :, :, :length] = prompt.keys[:, :1, :, :length]
    replicated.values[:, :, :, :length] = prompt.values[:, :1, :, :length]
    replicated.lengths = [length] * k
    return replicated


def _interrupted(branches: list[Branch], limits: DecodeLimits, cancel: CancelToken | None) -> bool:
    reason = ""
    if cancel is not None and cancel.cancelled:
        reason = "cancelled"
    elif limits.deadline is not None and limits.clock() > limits.deadline:
        reason = "deadline"
    if reason:
        for branch in branches:
            if not branch.done:
                branch.finish_reason = reason
    return bool(reason)


def greedy_batch(model: Transformer, prompts: list[list[int]], new_tokens: int, use_cache: bool = True) -> list[list[int]]:
    """Greedy continuation of a batch of prompts of different lengths (ragged rows, one
    prefill). use_cache=False recomputes every sequence from scratch at each step (the
    reference the cached path must agree with)."""
    if not prompts or any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    sequences = [list(p) for p in prompts]
    with torch.inference_mode():
        if use_cache:
            cache = RaggedKVCache(model.cache_shape, len(prompts), max(map(len, prompts)) + new_tokens, model.dtype, model.device)
            logits = _ragged_forward(model, sequences, cache)  # [B, V]
            for _ in range(new_tokens):
                tokens = logits.argmax(dim=-1)  # [B]
                for seq, token in zip(sequences, tokens.tolist()):
                    seq.append(token)
                if len(sequences[0]) - len(prompts[0]) == new_tokens:
                    break
                logits = model.step(tokens[:, None], cache)
        else:
            for _ in range(new_tokens):
                for seq in sequences:
                    cache = RaggedKVCache(model.cache_shape, 1, len(seq), model.dtype, model.device)
                    seq.append(int(model.step(torch.tensor([seq], device=model.device), cache).argmax()))
    return [seq[len(p) :] for seq, p in zip(sequences, prompts)]


def _ragged_forward(model: Transformer, sequences: list[list[int]], cache: RaggedKVCache) -> torch.Tensor:
    """Prefill right-padded rows; each row keeps only its own tokens. -> logits at each row's last token [B, V]."""
    lengths = [len(s) for s in sequences]
    width = max(lengths)
    padded = torch.tensor([s + [0] * (width - len(s)) for s in sequences], device=model.device)  # [B, T]
    hidden = model(padded, cache)  # [B, T, dim]
    cache.advance(lengths)
    last = torch.tensor(lengths, device=model.device) - 1  # [B]
    return model.logits(hidden[torch.arange(len(sequences)), last])
