"""The suite's small model (a real GGUF, SmolLM2-135M): conversion, tokenizer, and parity with transformers."""

from __future__ import annotations

import pytest
import torch

from kspec.engine.cache.kv import RaggedKVCache
from kspec.engine.models.hf_folder import load_transformer
from kspec.engine.models.resolve import resolve_model
from kspec.engine.models.tokenizer import IncrementalDetokenizer

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


def test_conversion_is_cached_and_complete():
    first = resolve_model(None, progress=False)
    stamp = (first.folder / "model.safetensors").stat().st_mtime_ns
    second = resolve_model(None, progress=False)
    assert second.folder == first.folder and second.name == first.name == "smollm2-135m (SmolLM2-135M-Instruct Q4_1)"
    assert (second.folder / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    assert {p.name for p in first.folder.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_tokenizer_round_trip_and_incremental_detokenization(default_engine):
    tokenizer = default_engine.target.tokenizer
    text = 'x = "héllo 日本語 🙂"  # ok\n\tif x:\n        return 12345'
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(token) for token in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)  # never half a character


def test_logits_and_greedy_tokens_match_transformers(default_engine):
    transformers = pytest.importorskip("transformers")
    model, tokenizer = default_engine.target.model, default_engine.target.tokenizer
    folder = resolve_model(None, progress=False).folder  # its matrices are kernel terms: given dequantized
    config = transformers.AutoConfig.from_pretrained(str(folder))
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(load_transformer(folder, torch.float32).state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied
    ids = tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]
        cache = RaggedKVCache(model.cache_shape, 1, len(ids) + 20, torch.float32)
        ours = model.logits(model(torch.tensor([ids]), cache))[0]
        assert (ours - expected).abs().max().item() < 1e-3
        reference = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
    from kspec.bench.baselines import greedy_batch

    assert greedy_batch(model, [ids], len(reference))[0] == reference
