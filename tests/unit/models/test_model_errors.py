"""Bad model inputs: one clear error, nothing half-written in the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kspec.engine.errors import ModelLoadError
from kspec.engine.models.resolve import resolve_model


@pytest.fixture()
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(cache))
    return cache


def _cached_model_folders(cache: Path) -> list[Path]:
    models = cache / "models"
    return list(models.iterdir()) if models.exists() else []


def test_truncated_gguf_is_a_clear_error_and_leaves_no_cache(tmp_path: Path, private_cache: Path, small_gguf: Path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(small_gguf.read_bytes()[: 5 * 1024 * 1024])
    with pytest.raises(ModelLoadError, match="GGUF"):
        resolve_model(str(truncated), progress=False)
    assert _cached_model_folders(private_cache) == []


def test_garbage_gguf(tmp_path: Path, private_cache: Path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        resolve_model(str(garbage), progress=False)
    assert _cached_model_folders(private_cache) == []


def test_unsupported_gguf_architecture(tmp_path: Path, private_cache: Path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="unsupported GGUF architecture 'phi3'.*llama"):
        resolve_model(str(path), progress=False)


def test_unsupported_hf_architecture_names_the_supported_ones(tmp_path: Path):
    from kspec.engine.models.hf_folder import read_args

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="unsupported model architecture 'gpt2'; supported: llama, mistral, qwen2, qwen3, starcoder2"):
        read_args(tmp_path)


def test_missing_model_path():
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model("./no/such/model.gguf", progress=False)


def test_hub_id_not_cached_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="never downloads"):
        resolve_model("Qwen/Qwen2.5-Coder-0.5B", progress=False)


def test_draft_with_other_vocabulary_is_rejected(tmp_path: Path, random_llama_dir: Path):
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.json", "model.safetensors"):
        (other / name).write_bytes((random_llama_dir / name).read_bytes())
    tokenizer = json.loads((random_llama_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = (next(t for t, i in vocab.items() if i == wanted) for wanted in (1000, 1001))
    vocab[first], vocab[second] = vocab[second], vocab[first]  # same tokens and size, other ids
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ModelLoadError, match="different vocabulary"):
        CompletionEngine.load(EngineConfig(model=str(random_llama_dir), draft=str(other), progress=False))
