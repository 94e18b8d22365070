"""What the benches compare kspec against: the baselines that ship nowhere else.

Attention without bifurcation (the prompt KV replicated per branch), decoding without
speculation (one token per branch per step), plain greedy decoding of a batch of prompts,
and the speculative decoder driven outside the batcher.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from kspec.engine.api import CancelToken
from kspec.engine.cache.kv import BranchKVCache, KVCache, RaggedKVCache
from kspec.engine.cache.prefix_cache import Prefill, prefill_uncached
from kspec.engine.decode.branches import Branch, BranchTracker, DecodeOutput, interrupted
from kspec.engine.decode.drafters import Drafter
from kspec.engine.decode.healing import HealingBias
from kspec.engine.decode.sampling import SamplingParams, choose_tokens, first_tokens
from kspec.engine.decode.speculative import SpeculationConfig, SpeculativeOutput, SpeculativeRun, UnitDone, pad_rows
from kspec.engine.models.transformer import Transformer
from kspec.kernels.contract import check_inputs
from kspec.kernels.reference import reference_bifurcated_attention


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
        cache = branch_cache(prefill.cache, k, limits.max_new_tokens + 1, shared_prefix)
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
            if interrupted(branches, limits, cancel):
                break
            steps += 1
            logits = model.step(tokens[:, None], cache)  # [k, V]
    decode_ms = (time.perf_counter() - started) * 1000 - prefill_ms
    return DecodeOutput(branches, prefill_ms, decode_ms, steps)


def branch_cache(prompt: RaggedKVCache, k: int, new_tokens: int, shared_prefix: bool) -> KVCache:
    """The KV of k branches after `prompt`: bifurcated (the prompt stored once) or the prompt replicated per branch."""
    if shared_prefix:
        return BranchKVCache.from_prompt(prompt, k, new_tokens)
    replicated = RaggedKVCache(
        prompt.shape, k, prompt.lengths[0] + new_tokens, prompt.keys.dtype, prompt.keys.device, compute_dtype=prompt.compute_dtype
    )
    length = prompt.lengths[0]
    replicated.keys[:, :, :, :length] = prompt.keys[:, :1, :, :length]
    replicated.values[:, :, :, :length] = prompt.values[:, :1, :, :length]
    replicated.lengths = [length] * k
    return replicated


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
            logits = ragged_forward(model, sequences, cache)  # [B, V]
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


def ragged_forward(model: Transformer, sequences: list[list[int]], cache: RaggedKVCache) -> torch.Tensor:
    """Prefill right-padded rows; each row keeps only its own tokens. -> logits at each row's last token [B, V]."""
    lengths = [len(s) for s in sequences]
    width = max(lengths)
    padded = torch.tensor([s + [0] * (width - len(s)) for s in sequences], device=model.device)  # [B, T]
    hidden = model(padded, cache)  # [B, T, dim]
    cache.advance(lengths)
    last = torch.tensor(lengths, device=model.device) - 1  # [B]
    return model.logits(hidden[torch.arange(len(sequences)), last])


def decode_speculative(
    model: Transformer,
    tracker: BranchTracker,
    k: int,
    params: SamplingParams,
    drafter: Drafter,
    config: SpeculationConfig = SpeculationConfig(),
    cancel: CancelToken | None = None,
    diverse: bool = False,
    prefill: Prefill | None = None,
    unit_done: UnitDone | None = None,
    healing: HealingBias | None = None,
    fork_ratio: float = 0.0,
) -> SpeculativeOutput:
    """One request decoded alone: its rounds are verified on its own cache."""
    run = SpeculativeRun(model, tracker, k, params, drafter, config, cancel, diverse, prefill, unit_done, healing, fork_ratio=fork_ratio)
    with torch.inference_mode():
        while not run.finished():
            inputs = pad_rows(run.propose(), model.device)  # [k', T]
            verify_started = time.perf_counter()
            hidden = model(inputs, run.cache)  # [k', T, dim]
            run.accept(hidden, (time.perf_counter() - verify_started) * 1000)
    return run.output()
