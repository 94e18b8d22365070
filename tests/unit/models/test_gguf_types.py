"""Every GGUF type a user downloads loads, as kspec's kernel terms, against `gguf`'s own dequantize
(engine/models/gguf_blocks.py), and files written with the K-type encoders (gguf_encode.py,
bench/model_shapes.py) run on the CPU fast path like their float32 dequantization."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kspec.bench.model_shapes import SHAPES, Shape, tensor_type, use_more_bits, write_shape
from kspec.engine.cache.kv import BranchKVCache, RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.models.gguf_blocks import NATIVE_TYPES, converted_to, tensor_terms
from kspec.engine.models.gguf_encode import encode
from kspec.engine.models.loading import load_model
from kspec.engine.models.cpu_profile import Q6Q8_ISAS
from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers
from kspec.engine.models.quantized import GROUP, Q6Q8Term, Q8Q8Term, SixBitCodes, TiledTerm, six_bit_codes, six_bit_name, weight_terms


def _reference(data: np.ndarray, kind: str, shape: tuple[int, int]) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    return np.asarray(quants.dequantize(data, GGMLQuantizationType[kind]), dtype=np.float32).reshape(shape)


def _weights(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w[0, :GROUP] = 0.0  # an all-zero block
    w[1] += 0.05  # a row with no negative weights (Q4_K's min of 0)
    return w


def _terms_sum(terms) -> np.ndarray:  # type: ignore[no-untyped-def]
    return sum(t.dequantize() for t in terms).numpy()


@pytest.mark.parametrize("kind", NATIVE_TYPES)
def test_the_file_codes_are_the_gguf_weights(kind: str) -> None:
    """The types whose codes the kernels take: the terms' sum is gguf's dequantization, exactly
    (the K-types' d sc and m + 136 s computed in float32: within 2^-22 of the largest weight)."""
    w = _weights(40, 512, seed=len(kind))
    data = encode(w, kind)
    expected = _reference(data, kind, w.shape)
    terms = tensor_terms(data, kind, w.shape)
    assert terms is not None and len(terms) == (1 if kind in ("Q4_0", "Q4_1", "Q4_K", "Q6_K") else 2)
    assert isinstance(terms[0], SixBitCodes) == (kind == "Q6_K")
    got = _terms_sum(terms)
    assert float(np.abs(got - expected).max()) <= 2**-22 * float(np.abs(expected).max())


def test_the_encoders_round_to_their_types_step() -> None:
    """Our K-type encoders write bytes gguf decodes to the weights within the type's step."""
    w = _weights(16, 512, seed=3)
    for kind, step in (("Q4_K", 1 / 15), ("Q5_K", 1 / 31), ("Q6_K", 1 / 31)):
        back = _reference(encode(w, kind), kind, w.shape)
        block_range = np.ptp(w.reshape(16, -1, GROUP), axis=-1).repeat(GROUP, -1)  # [16, 512]
        assert bool((np.abs(back - w) <= step * block_range + 1e-6).all()), kind
    with pytest.raises(ValueError, match="multiple of 256"):
        encode(np.zeros((2, 96), np.float32), "Q4_K")


def test_q6_k_takes_the_8_bit_form_within_a_254th_of_its_blocks_where_no_6_bit_loop_runs() -> None:
    w = _weights(24, 768, seed=5)
    data = encode(w, "Q6_K")
    expected = _reference(data, "Q6_K", w.shape)
    (six,) = tensor_terms(data, "Q6_K", w.shape) or [None]
    assert isinstance(six, SixBitCodes) and converted_to("Q6_K") == "codes"
    codes = {six_bit_name("w"): six}
    terms = weight_terms(codes, "w")  # what PyTorch's kernel and the 8-bit form take
    assert terms is not None and len(terms) == 2 and six_bit_codes(codes, "w") is six
    block_max = np.abs(expected.reshape(24, -1, GROUP)).max(-1).repeat(GROUP, -1)
    assert bool((np.abs(_terms_sum(terms) - expected) <= block_max / 254 * 1.001 + 1e-9).all())


@pytest.mark.parametrize(("kind", "offsets", "form"), [
    ("Q2_K", (80, 82), "q4"), ("Q3_K", (108,), "q4"), ("IQ4_NL", (0,), "q8"), ("IQ4_XS", (0,), "q8"),
])  # fmt: skip
def test_types_without_a_kernel_are_requantized_to_the_nearest_form(kind: str, offsets: tuple[int, ...], form: str) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (8, 512 // block, size), dtype=np.uint8)
    for at in offsets:  # finite float16 scales
        raw[..., at : at + 2] = rng.uniform(0.001, 0.01, raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    data = raw.reshape(8, -1)
    expected = _reference(data, kind, (8, 512))
    terms = tensor_terms(data, kind, (8, 512))
    assert terms is not None and converted_to(kind) == form and len(terms) == (1 if form == "q4" else 2)
    per_block = expected.reshape(8, -1, GROUP)
    bound = (np.ptp(per_block, -1) / 15 if form == "q4" else np.abs(per_block).max(-1) / 254 * 1.001).repeat(GROUP, -1)
    assert bool((np.abs(_terms_sum(terms) - expected) <= bound + 1e-9).all())


def test_float_matrices_follow_the_quantization_setting() -> None:
    w = _weights(8, 64, seed=9)
    assert tensor_terms(w.astype(np.float16), "F16", w.shape, "none") is None
    assert len(tensor_terms(w, "F32", w.shape, "q8") or []) == 2
    assert len(tensor_terms(w, "F32", w.shape, "q4") or []) == 1
    assert tensor_terms(np.zeros((4, 40), np.float32), "F32", (4, 40)) is None  # K not a multiple of 32: dense


def test_the_mix_follows_llama_cpp() -> None:
    """Q4_K_M: Q6_K head and the picked layers' attn_v / ffn_down; fallbacks where rows are not
    a multiple of 256 weights."""
    assert [use_more_bits(i, 8) for i in range(8)] == [True, False, False, True, False, False, True, True]
    assert tensor_type("Q4_K_M", "head", -1, 8, 1536) == "Q6_K"
    assert tensor_type("Q4_K_M", "attn_q", 0, 8, 1536) == "Q4_K"
    assert tensor_type("Q4_K_M", "ffn_down", 0, 8, 8960) == "Q6_K"  # 8960 = 35 x 256
    assert tensor_type("Q4_K_M", "attn_q", 3, 8, 576) == "Q5_0" and tensor_type("Q4_K_M", "attn_v", 0, 8, 576) == "Q8_0"


ODD = Shape("llama", 3, 320, 640, 5, 1, tied=False)  # 320 = 1.25 x 256: llama.cpp's fallbacks, llama's rotary order
UNTIED = Shape("qwen2", 2, 256, 512, 4, 2, tied=False)  # a head and a table of their own: Q6_K in a Q6_K file
QWEN3 = Shape("qwen3", 2, 256, 512, 4, 2, tied=True)  # q/k norms: the PyTorch ops over the kernels
STARCODER2 = Shape("starcoder2", 2, 256, 1024, 4, 2, tied=True)  # LayerNorm with bias, GELU, biases everywhere


@pytest.mark.parametrize(("shape", "mix"), [
    (SHAPES["tiny"], "Q4_K_M"), (ODD, "Q4_K_M"), (SHAPES["tiny"], "Q5_K_M"), (ODD, "F16"), (STARCODER2, "Q4_K_M"), (QWEN3, "Q4_K_M"),
    (UNTIED, "Q6_K"),
])  # fmt: skip
def test_a_written_file_runs_on_the_fast_path_like_its_float32_weights(tmp_path, monkeypatch, small_gguf, shape: Shape, mix: str) -> None:
    """A GGUF written like llama-quantize's output loads with every matrix on the kernels (8-bit
    and 4-bit forms mixed within a layer, the C++ layer loop over both), and its logits follow
    the float32 model of the same file (dequantized), within the 8-bit activations' rounding."""
    monkeypatch.setenv("KSPEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_shape(shape, mix, tmp_path / f"m-{mix}.gguf", small_gguf, seed=1, progress=False)
    fast = load_model(str(path), EngineConfig(progress=False, fit_to_machine=False))
    if "int4" not in fast.compute:
        pytest.skip(f"no CPU fast path here: {fast.compute}")
    reference = load_model(str(path), EngineConfig(progress=False, dtype="float32", fit_to_machine=False))
    terms = [m.terms for m in fast.model.modules() if hasattr(m, "terms") and hasattr(m, "has_int4")]
    assert terms and all(len(t) >= 1 for t in terms), fast.compute  # no matrix left dense
    if all(isinstance(t[0], TiledTerm) for t in terms):
        from gguf import GGUFReader

        alone = [t.name for t in GGUFReader(str(path)).tensors if t.tensor_type.name == "Q6_K" and "attn_v" not in t.name]
        six_bit_loop = cpu_layers.matmul_isa(cache_root()) in Q6Q8_ISAS  # a Q6_K v is fused with q and k: 8-bit
        assert any(isinstance(t[0], Q6Q8Term) for t in terms) == (six_bit_loop and bool(alone)), alone
        eight_bit = any(isinstance(t[0], Q8Q8Term) for t in terms)  # the Q5_0 / Q8_0 / F16 ones, a v beside Q6_K, Q6_K without its loop
        assert eight_bit == (mix != "Q6_K" or not six_bit_loop), fast.compute
    tokens = torch.tensor([fast.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")])
    with torch.inference_mode():
        logits = [m.model.logits(m.model(tokens, RaggedKVCache(m.model.cache_shape, 1, tokens.shape[1], m.model.dtype))[0])
                  for m in (fast, reference)]  # fmt: skip
    scale = float(logits[1].abs().max())
    assert float((logits[0] - logits[1]).abs().max()) <= 0.05 * scale
    if fast.model.native_steps is not None:  # the loop's steps against the PyTorch ops on this model
        model = fast.model
        with torch.inference_mode():
            cache = RaggedKVCache(model.cache_shape, 1, tokens.shape[1], model.dtype)
            model(tokens, cache)
            cache.advance(tokens.shape[1])
            step_logits, loop = [], model.native_steps
            for native in (loop, None):
                model.native_steps = native
                branches = BranchKVCache.from_prompt(cache, 2, 4)
                step_logits.append(model.step(torch.tensor([[5], [9]]), branches))  # [2, V]
            model.native_steps = loop
        assert float((step_logits[0] - step_logits[1]).abs().max()) <= 0.02 * float(step_logits[1].abs().max())


def test_the_4bit_quantizer_searches_for_a_smaller_error_than_one_step() -> None:
    """Each block keeps the step of least squared error: never worse than the plain min/max step
    (the first candidates' 15 levels), and better over a whole matrix."""
    from kspec.engine.models.gguf_blocks import quantize_4bit
    from kspec.engine.models.quantized import Q4Codes

    w = _weights(64, 256, seed=11)
    searched = _terms_sum(quantize_4bit(w))
    plain = Q4Codes.quantize(torch.from_numpy(w)).dequantize().numpy()  # min/max per block, no search
    per_block = lambda x: ((x - w) ** 2).reshape(64, -1, GROUP).sum(-1)  # noqa: E731
    assert bool((per_block(searched) <= per_block(plain) * (1 + 1e-5) + 1e-12).all())
    assert float(per_block(searched).sum()) < 0.9 * float(per_block(plain).sum())
