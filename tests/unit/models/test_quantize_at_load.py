"""An HF folder of float weights is quantized once for the CPU fast path and cached by its files."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from model_factory import write_random_model
from kspec.engine.cache.kv import RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.models import quantize_at_load
from kspec.engine.models.loading import load_model
from kspec.engine.models.quantized import CpuLinear


def _logits(loaded, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    model = loaded.model
    with torch.inference_mode():
        return model.logits(model(tokens, RaggedKVCache(model.cache_shape, 1, tokens.shape[1], model.dtype))[0])


@pytest.mark.parametrize(("quantize", "similarity"), [("q8", 0.999), ("q4", 0.97)])
def test_an_hf_folder_runs_on_the_kernels_and_its_terms_are_cached(tmp_path, monkeypatch, quantize: str, similarity: float) -> None:
    folder = write_random_model(tmp_path / "hf", "qwen2", seed=3, hidden_size=128, intermediate_size=256)
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    config = EngineConfig(progress=False, fit_to_machine=False, quantize=quantize)
    fast = load_model(str(folder), config)
    if "int4" not in fast.compute:
        pytest.skip(f"no CPU fast path here: {fast.compute}")
    linears = [m for m in fast.model.modules() if isinstance(m, CpuLinear)]
    choice = fast.model.kernel_choice  # measured here: a dense copy only where it paid on this CPU
    assert choice is not None and linears and all(m.has_int4 and m.has_dense == choice.keep_dense for m in linears), fast.compute
    cached = list((tmp_path / "cache" / "quantized").glob("*/q4.safetensors"))
    assert len(cached) == 1
    reference = load_model(str(folder), EngineConfig(progress=False, fit_to_machine=False, dtype="float32"))
    tokens = torch.tensor([fast.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    want = _logits(reference, tokens)
    got = _logits(fast, tokens)
    centered = [t - t.mean(-1, keepdim=True) for t in (got, want)]  # [T, V] each
    cosine = torch.nn.functional.cosine_similarity(*centered, dim=-1)  # [T]
    assert float(cosine.min()) >= similarity
    # the second start reads the cached terms: no quantizing
    monkeypatch.setattr(quantize_at_load, "quantize_8bit", None)
    monkeypatch.setattr(quantize_at_load, "quantize_4bit", None)
    kernels = {"cpu_int4": choice.int4_kernel, "cpu_weights": "4bit+dense" if choice.keep_dense else "4bit"}  # the first load's timed choice
    again = load_model(str(folder), replace(config, **kernels))
    torch.testing.assert_close(_logits(again, tokens), _logits(fast, tokens), atol=0, rtol=0)
    # changed weights: quantized again under a new key
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    assert quantize_at_load.source_key(folder, quantize) != cached[0].parent.name


def test_none_keeps_the_dense_weights(tmp_path, monkeypatch) -> None:
    folder = write_random_model(tmp_path / "hf", "llama", seed=4)
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_model(str(folder), EngineConfig(progress=False, fit_to_machine=False, quantize="none"))
    assert not (tmp_path / "cache" / "quantized").exists()
    assert "int4" not in loaded.compute
    with pytest.raises(ValueError, match="quantize must be one of"):
        EngineConfig(quantize="q3")
