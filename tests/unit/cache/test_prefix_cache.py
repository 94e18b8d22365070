"""Prefix reuse across keystrokes: same logits as a cold prefill, longest match, LRU budget."""

from __future__ import annotations

import torch

from kspec.engine.cache import prefix_cache
from kspec.engine.cache.kv import BranchKVCache, RaggedKVCache
from kspec.engine.cache.prefix_cache import BRANCH_EXTEND_TOKENS, PrefixCache, PrefixCacheConfig, extend, prefill_uncached

SOURCE = "import json\n\n\ndef load(path):\n    with open(path) as handle:\n        return json.load(handle)\n\n\ndef save(path, data):\n    with open(path, 'w') as handle:\n        json.dump(data, handle)\n"


def test_hit_gives_the_same_logits_as_a_cold_prefill(random_engine):
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    cache = PrefixCache()
    first = tokenizer.encode(SOURCE + "\n\ndef dump")
    cache.prefill(model, first)
    second = tokenizer.encode(SOURCE + "\n\ndef dumps(")
    warm = cache.prefill(model, second)
    cold = prefill_uncached(model, second)
    assert warm.reused_tokens >= len(first) - 2
    assert cold.reused_tokens == 0
    assert torch.allclose(warm.last_logits, cold.last_logits, atol=1e-4)
    assert torch.allclose(warm.cache.keys[:, :, :, : len(second)], cold.cache.keys[:, :, :, : len(second)], atol=1e-5)


def test_a_few_tokens_after_a_cached_part_run_as_one_branch_over_it(random_engine, monkeypatch):
    """`extend`: the same hidden states and K/V as the plain cache's forward, through a branch
    over the cached part for a few tokens, the plain cache for many."""
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    ids = tokenizer.encode(SOURCE)
    cached, few, many = ids[:30], ids[30:33], ids[30 : 31 + BRANCH_EXTEND_TOKENS]
    assert len(many) > BRANCH_EXTEND_TOKENS
    branches = []
    real_from_prompt = prefix_cache.BranchKVCache.from_prompt
    monkeypatch.setattr(prefix_cache.BranchKVCache, "from_prompt", lambda *a: branches.append(a) or real_from_prompt(*a))
    for new in (few, many):
        caches = [RaggedKVCache(model.cache_shape, 1, len(ids), model.dtype) for _ in range(2)]
        with torch.inference_mode():
            for cache in caches:
                model(torch.tensor([cached]), cache)
                cache.advance(len(cached))
            want = model(torch.tensor([new]), caches[0])  # [1, T, dim]
            got = extend(model, caches[1], new)
        end = len(cached) + len(new)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(caches[1].keys[:, :, :, :end], caches[0].keys[:, :, :, :end], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(caches[1].values[:, :, :, :end], caches[0].values[:, :, :, :end], atol=1e-5, rtol=1e-5)
    assert len(branches) == 1  # the few tokens only


def test_a_prompt_kv_stored_in_float16(random_engine, monkeypatch):
    """A model whose prompt KV is float16 (the CPU fast path's, Transformer.kv_dtype): a cold
    prefill, a reuse and a keystroke's few tokens (run as a float32 branch, then copied in) keep
    it in float16 at half the bytes, with the logits of float32 KV to float16's rounding."""
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    first, second = tokenizer.encode(SOURCE + "\n\ndef dump"), tokenizer.encode(SOURCE + "\n\ndef dumps(")
    exact = prefill_uncached(model, second)
    monkeypatch.setattr(model, "prompt_kv_dtype", torch.float16)
    cache = PrefixCache()
    cache.prefill(model, first)
    warm = cache.prefill(model, second)
    cold = prefill_uncached(model, second)
    assert warm.cache.keys.dtype == cold.cache.keys.dtype == torch.float16
    assert 0 < len(second) - warm.reused_tokens <= BRANCH_EXTEND_TOKENS  # the keystroke's tokens ran as a branch
    scale = float(exact.last_logits.abs().max())
    torch.testing.assert_close(warm.last_logits, cold.last_logits, atol=1e-4 * scale, rtol=0)
    torch.testing.assert_close(cold.last_logits, exact.last_logits, atol=1e-2 * scale, rtol=0)
    assert 2 * warm.cache.nbytes == exact.cache.nbytes
    assert BranchKVCache.from_prompt(warm.cache, 2, 4).keys.dtype == torch.float32  # branches in the model's dtype


def test_resegmented_last_word_reuses_everything_before_it(random_engine):
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    before, after = SOURCE + "result = coun", SOURCE + "result = count"
    ids_before, ids_after = tokenizer.encode(before), tokenizer.encode(after)
    shared = next(i for i, (a, b) in enumerate(zip(ids_before, ids_after)) if a != b)
    assert shared < len(ids_before)  # the tokenizer did re-segment the last word
    cache = PrefixCache()
    cache.prefill(model, ids_before)
    assert cache.prefill(model, ids_after).reused_tokens == shared


def test_longest_entry_wins_and_lru_eviction_keeps_the_budget(random_engine):
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    prompts = [tokenizer.encode(SOURCE + f"\nvalue_{i} = {i}\n" * 12) for i in range(4)]  # tails too different to supersede
    one_entry = prefill_uncached(model, prompts[0]).cache.nbytes
    cache = PrefixCache(PrefixCacheConfig(max_bytes=int(2.5 * one_entry)))
    for ids in prompts:
        cache.prefill(model, ids)
    assert len(cache) == 2 and cache.bytes_held <= int(2.5 * one_entry)
    hit = cache.prefill(model, prompts[3] + tokenizer.encode("x = 1\n"))
    assert hit.reused_tokens == len(prompts[3])  # the newest, longest match


def test_keystrokes_in_one_document_keep_one_entry(random_engine):
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    cache = PrefixCache()
    for typed in ("result = c", "result = co", "result = cou", "result = coun"):
        cache.prefill(model, tokenizer.encode(SOURCE + typed))
    assert len(cache) == 1
    other = tokenizer.encode("def unrelated():\n    return 42\n" * 3)
    cache.prefill(model, other)
    assert len(cache) == 2  # another document keeps its own entry
    again = cache.prefill(model, tokenizer.encode(SOURCE + "result = count"))
    assert again.reused_tokens >= len(tokenizer.encode(SOURCE)) and len(cache) == 2


def test_disabled_cache_never_reuses(random_engine):
    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    cache = PrefixCache(PrefixCacheConfig(max_bytes=0))
    ids = tokenizer.encode(SOURCE)
    cache.prefill(model, ids)
    assert cache.prefill(model, ids).reused_tokens == 0 and len(cache) == 0


def test_cancelled_prefill_keeps_its_work_for_the_next_keystroke(random_engine):
    import pytest

    from kspec.engine.api import CancelToken
    from kspec.engine.errors import CancelledError

    model, tokenizer = random_engine.target.model, random_engine.target.tokenizer
    ids = tokenizer.encode(SOURCE * 3)
    cache = PrefixCache(PrefixCacheConfig(chunk_tokens=16))
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(CancelledError):
        cache.prefill(model, ids, cancel)  # stops after the first chunk
    assert len(cache) == 1
    resumed = cache.prefill(model, ids)
    assert resumed.reused_tokens == 16
    assert torch.allclose(resumed.last_logits, prefill_uncached(model, ids).last_logits, atol=1e-4)


def test_load_reports_progress(random_llama_dir):
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    seen: list[float] = []
    CompletionEngine.load(EngineConfig(model=str(random_llama_dir), progress=False), lambda fraction, message: seen.append(fraction))
    assert seen and seen == sorted(seen) and seen[-1] == 1.0
