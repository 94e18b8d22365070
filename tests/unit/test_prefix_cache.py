"""Prefix reuse across keystrokes: same logits as a cold prefill, longest match, LRU budget."""

from __future__ import annotations

import torch

from kspec.engine.cache.prefix_cache import PrefixCache, PrefixCacheConfig, prefill_uncached

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
