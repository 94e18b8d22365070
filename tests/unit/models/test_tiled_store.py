"""kspec's kernel forms kept on disk (engine/models/tiled_store.py): a second load maps what the
first built, computes the same logits bit for bit, and builds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kspec.engine.cache.kv import RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.models.loading import load_model
from kspec.engine.models.tiled_store import FORMS, TiledStore


def _logits(loaded, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    model = loaded.model
    with torch.inference_mode():
        return model.logits(model(tokens, RaggedKVCache(model.cache_shape, 1, tokens.shape[1], model.dtype))[0])


def test_a_second_load_maps_the_kernels_forms_and_computes_the_same(small_gguf: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    config = EngineConfig(progress=False, fit_to_machine=False, cpu_int4="kspec", cpu_weights="4bit")  # nothing left to measure
    first = load_model(str(small_gguf), config)
    if "kspec's 4-bit" not in first.compute:
        pytest.skip(f"kspec's kernel does not run here: {first.compute}")
    stores = list((tmp_path / "cache").rglob("tiled-*.pt"))
    assert len(stores) == 1
    tokens = torch.tensor([first.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    want = _logits(first, tokens)

    def no_building(*args, **kwargs):
        raise AssertionError("a kernel form was built again")

    for form in FORMS.values():
        monkeypatch.setattr(form, "__init__", no_building)
    again = load_model(str(small_gguf), config)
    torch.testing.assert_close(_logits(again, tokens), want, atol=0, rtol=0)
    assert again.compute == first.compute


def test_an_unreadable_store_is_a_miss(tmp_path: Path):
    path = tmp_path / "tiled-avx2-0.pt"
    assert TiledStore.open(path) is None
    path.write_bytes(b"not a store")
    assert TiledStore.open(path) is None
    torch.save({"format": "another", "layout": "{}", "tensors": {}}, path)
    assert TiledStore.open(path) is None
