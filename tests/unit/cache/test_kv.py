"""KV bookkeeping: the k-branch cache against a naive list model (hypothesis), and decoding
on the shared-prefix cache against the replicated one."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kspec.bench.baselines import decode_regular
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.cache.kv import BranchKVCache, CacheShape, RaggedKVCache
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.stopping import StopRule

SHAPE = CacheShape(n_layers=2, n_kv_heads=2, head_dim=4)
HEADS = 4
CAPACITY = 12

operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.lists(st.integers(0, 3), min_size=3, max_size=3)),
    st.tuples(st.just("truncate"), st.integers(0, 2), st.integers(0, CAPACITY)),
    st.tuples(st.just("fork"), st.integers(0, 2), st.integers(0, 2)),
)


def _naive_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q [H, D] over keys/values [Hkv, N, D] (all visible) -> [H, D]."""
    group = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)  # [H, N, D]
    weights = torch.softmax((keys @ q[:, :, None]).squeeze(-1) / math.sqrt(q.shape[-1]), dim=-1)  # [H, N]
    return (weights[:, None, :] @ values).squeeze(1)


@settings(max_examples=60, deadline=None)
@given(prefix_len=st.integers(0, 5), operations=st.lists(operation, max_size=12), seed=st.integers(0, 2**16))
def test_branch_cache_matches_a_list_model(prefix_len: int, operations: list, seed: int):
    generator = torch.Generator().manual_seed(seed)
    prefix_k = torch.randn(SHAPE.n_layers, 1, SHAPE.n_kv_heads, prefix_len, SHAPE.head_dim, generator=generator)
    prefix_v = torch.randn(prefix_k.shape, generator=generator)
    cache = BranchKVCache(SHAPE, prefix_k, prefix_v, k=3, capacity=CAPACITY)
    naive: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[], [], []]  # per branch: (k, v) [L, Hkv, D]
    for kind, a, b in operations:
        if kind == "append":
            new, kept = a, [min(n, a) for n in b]
            if max(cache.lengths) + new > CAPACITY:
                continue
            step = cache.prepare(new)
            k_new = torch.randn(SHAPE.n_layers, 3, SHAPE.n_kv_heads, new, SHAPE.head_dim, generator=generator)
            v_new = torch.randn(k_new.shape, generator=generator)
            q = torch.randn(3, HEADS, new, SHAPE.head_dim, generator=generator)
            for layer in range(SHAPE.n_layers):
                out = cache.attend(layer, q, k_new[layer], v_new[layer], step)  # [3, H, T, D]
                for branch in range(3):  # the last new token of each branch sees everything before it
                    history = [(kk[layer], vv[layer]) for kk, vv in naive[branch]]
                    keys = torch.cat([prefix_k[layer, 0]] + [h[0][:, None] for h in history] + [k_new[layer, branch]], dim=1)
                    values = torch.cat([prefix_v[layer, 0]] + [h[1][:, None] for h in history] + [v_new[layer, branch]], dim=1)
                    expected = _naive_attention(q[branch, :, -1], keys, values)
                    assert torch.allclose(out[branch, :, -1], expected, atol=1e-5)
            cache.advance(kept)
            for branch in range(3):
                naive[branch] += [(k_new[:, branch, :, t], v_new[:, branch, :, t]) for t in range(kept[branch])]
        elif kind == "truncate":
            length = min(b, len(naive[a]))
            cache.truncate(a, length)
            naive[a] = naive[a][:length]
        else:
            cache.fork(a, b)
            naive[b] = list(naive[a])
        for branch in range(3):
            keys, values = cache.branch_entries(branch)  # [L, Hkv, len, D]
            assert keys.shape[2] == len(naive[branch]) == cache.lengths[branch]
            for index, (kk, vv) in enumerate(naive[branch]):
                assert torch.equal(keys[:, :, index], kk) and torch.equal(values[:, :, index], vv)
    element = prefix_k.element_size()
    assert cache.nbytes == 2 * element * (prefix_k.numel() + 3 * SHAPE.n_layers * SHAPE.n_kv_heads * CAPACITY * SHAPE.head_dim)


def test_shared_prefix_stores_the_prompt_once():
    prompt = RaggedKVCache(SHAPE, 1, 100, torch.float32)
    prompt.advance(100)
    shared = BranchKVCache.from_prompt(prompt, k=8, capacity=10)
    replicated_bytes = 8 * (100 + 10) * 2 * SHAPE.n_layers * SHAPE.n_kv_heads * SHAPE.head_dim * 4
    assert shared.nbytes == (100 + 8 * 10) * 2 * SHAPE.n_layers * SHAPE.n_kv_heads * SHAPE.head_dim * 4
    assert shared.nbytes < replicated_bytes / 4


def test_decoding_on_shared_prefix_gives_the_same_greedy_tokens(random_engine):
    tokenizer, model = random_engine.target.tokenizer, random_engine.target.model
    ids = tokenizer.encode("import os\n\n\ndef walk(root):\n    for entry in os.scandir(root):\n")
    for k in (1, 3, 8):
        outputs = []
        for shared in (True, False):
            tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(16, ignore_eos=True), ids)
            output = decode_regular(model, tracker, k, SamplingParams(), diverse=True, shared_prefix=shared)
            outputs.append([b.token_ids for b in output.branches])
        assert outputs[0] == outputs[1]
