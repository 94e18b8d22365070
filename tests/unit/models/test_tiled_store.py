"""kspec's kernel forms kept on disk (engine/models/tiled_store.py): a second load maps what the
first built, computes the same logits bit for bit, builds nothing and reads no 4-bit codes; the
embedding table is looked up in its form."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kspec.bench.model_shapes import Shape, write_shape
from kspec.engine.cache.kv import RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.errors import ModelLoadError
from kspec.engine.models.loading import load_model
from kspec.engine.models.quantized import (
    GROUP, Q4_FILE, Int4Embedding, Q4Codes, Q4File, Q4Q8Term, Q5Q8Term, Q6Q8Term, Q8Q8Term, SixBitCodes, TiledEmbedding, TiledTerm,
)
from kspec.engine.models.tiled_store import FORMS, TiledStore


def _logits(loaded, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    model = loaded.model
    with torch.inference_mode():
        return model.logits(model(tokens, RaggedKVCache(model.cache_shape, 1, tokens.shape[1], model.dtype))[0])


UNTIED = Shape("qwen2", 2, 256, 512, 4, 2, tied=False)  # a head (Q6_K) and a table (Q4_K) of their own


def _folder_bytes(cache: Path) -> int:
    return sum(path.stat().st_size for path in (cache / "models").rglob("*") if path.is_file())


@pytest.mark.parametrize("tied", [True, False])
def test_a_second_start_maps_every_form_and_reads_no_codes(small_gguf: Path, tmp_path: Path, monkeypatch, tied: bool):
    """The first start keeps kspec's kernel forms of every weight (and the embedding table, in its
    form or its exact 4-bit terms) and drops the 4-bit codes it built them from: the converted model takes about the GGUF file's own
    bytes. A second start maps the forms alone (no codes read, no form built) and computes the same
    logits bit for bit; a float32 start reads the codes from the GGUF file again."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(cache))
    gguf = small_gguf if tied else write_shape(UNTIED, "Q4_K_M", tmp_path / "untied.gguf", small_gguf, seed=2, progress=False)
    config = EngineConfig(progress=False, fit_to_machine=False, cpu_int4="kspec", cpu_weights="4bit")  # nothing left to measure
    first = load_model(str(gguf), config)
    if "kspec's 4-bit" not in first.compute:
        pytest.skip(f"kspec's kernel does not run here: {first.compute}")
    assert len(list(cache.rglob("tiled-*.pt"))) == 1 and not list(cache.rglob(Q4_FILE))
    assert _folder_bytes(cache) <= 1.2 * gguf.stat().st_size  # forms of 4.5-9 bits a weight, the tokenizer, the norms
    # the tied Q4_1 model's 8-bit head holds its table exactly; the Q4_K table's float16 d sc would not: its 4-bit terms
    assert isinstance(first.model.model.embed_tokens, TiledEmbedding if tied else Int4Embedding)
    assert ("embedding from the head's 8-bit codes" if tied else "4-bit embedding") in first.compute
    tokens = torch.tensor([first.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    want = _logits(first, tokens)

    def no_building(*args, **kwargs):
        raise AssertionError("a kernel form was built again, or the 4-bit codes were read")

    with monkeypatch.context() as patched:
        for form in FORMS.values():
            patched.setattr(form, "__init__", no_building)
        patched.setattr(Q4File, "__init__", no_building)
        again = load_model(str(gguf), config)
        torch.testing.assert_close(_logits(again, tokens), want, atol=0, rtol=0)
        assert again.compute == first.compute
    told: list[tuple[float, str]] = []
    reference = load_model(str(gguf), EngineConfig(progress=False, fit_to_machine=False, dtype="float32"), lambda f, m: told.append((f, m)))
    assert len(list(cache.rglob(Q4_FILE))) == 1  # written again from the GGUF file for the float32 path
    assert (0.8, "reading the GGUF file's 4-bit weights") in told  # an editor's progress shows it, not going back
    assert float((_logits(reference, tokens) - want).abs().max()) <= 0.1 * float(want.abs().max())  # the 8-bit activations aside


def test_dropped_codes_whose_file_is_gone_are_a_one_line_error(small_gguf: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "moved.gguf"
    shutil.copyfile(small_gguf, gguf)
    first = load_model(str(gguf), EngineConfig(progress=False, fit_to_machine=False, cpu_int4="kspec", cpu_weights="4bit"))
    if "kspec's 4-bit" not in first.compute:
        pytest.skip(f"kspec's kernel does not run here: {first.compute}")
    gguf.unlink()
    folder = next((tmp_path / "cache" / "models").iterdir())
    with pytest.raises(ModelLoadError, match=f"{gguf}\\) is gone; load that file again"):
        load_model(str(folder), EngineConfig(progress=False, fit_to_machine=False, dtype="float32"))


@pytest.mark.parametrize("form", [Q4Q8Term, Q5Q8Term, Q6Q8Term, Q8Q8Term])
def test_an_embedding_row_is_what_its_form_multiplies(form: type[TiledTerm]):
    """A looked-up row, decoded from its tile's lane (37 rows: the last tile padded), is the form's
    weights: s u + m (the 6-bit form: s of each half block times u - 32), s and m in float16."""
    torch.manual_seed(0)
    n, k = 37, 96
    s, m = torch.rand(n, k // GROUP).half().float(), (torch.rand(n, k // GROUP) - 0.5).half().float()
    if form is Q6Q8Term:
        six = SixBitCodes(torch.randint(0, 64, (n, k), dtype=torch.uint8), torch.rand(n, k // 16).half().float())
        term, weights = Q6Q8Term(six, None), six.dequantize()  # type: ignore[arg-type]
    elif form is Q4Q8Term:
        codes = Q4Codes(torch.randint(0, 16, (n, k), dtype=torch.uint8), s, m + 8 * s)  # m + 8 s: its zero, so its m is m
        term, weights = Q4Q8Term(codes, None), codes.dequantize()  # type: ignore[arg-type]
    else:
        u = torch.randint(0, 32 if form is Q5Q8Term else 256, (n, k), dtype=torch.uint8)
        term, weights = form(u, s, m, None), (u.float().view(n, -1, GROUP) * s[..., None] + m[..., None]).view(n, k)  # type: ignore[call-arg]
    rows = torch.tensor([[0, 5, 15], [16, 36, 17]])  # [B, T]: first and last lanes, the padded tile
    got = TiledEmbedding([term])(rows)
    assert got.shape == (2, 3, k) and got.dtype == torch.float32
    torch.testing.assert_close(got, weights[rows], atol=1e-6, rtol=0)


def test_an_unreadable_store_is_a_miss(tmp_path: Path):
    path = tmp_path / "tiled-avx2-0.pt"
    assert TiledStore.open(path) is None
    path.write_bytes(b"not a store")
    assert TiledStore.open(path) is None
    torch.save({"format": "another", "layout": "{}", "tensors": {}}, path)
    assert TiledStore.open(path) is None
