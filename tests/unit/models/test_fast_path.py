"""The CPU fast path (`--dtype auto`): a Q4 GGUF's own 4-bit weights, fused projections, bfloat16.

Tolerances (docs/measurements/avx512-no-vnni.md, "Fast path accuracy", states the same):
- 4-bit codes read from GGUF Q4_0 / Q4_1 blocks dequantize exactly (max diff 0) to the gguf
  package's float32 dequantization, and come back exactly through PyTorch's int4 kernel with
  float32 group parameters.
- small random models (llama GQA, tied qwen2 with q/k/v bias, starcoder2 ungated + LayerNorm +
  biases), whose float32 weights ARE the 4-bit weights: fast-path logits of a prefill, decode
  steps and a verification within 3% of the logit range of the float32 model's (bfloat16
  rounding at the projections; the 4-bit kernel, a dense bfloat16 copy and the row switch);
  with kspec's 4-bit x 8-bit kernel (AVX2) the activations round to 8 bits per block of 32
  instead: within LOGIT_SHARE["kspec"] of the range.
- the default model, teacher-forced on float32 greedy continuations of real code: the fast
  path's argmax agrees at >= 90% of positions (measured: see docs/measurements/).
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import copy
import dataclasses
import inspect
import json.decoder

import numpy as np
import pytest
import torch

from model_factory import quantized_model
from kspec.engine.cache.kv import BranchKVCache, RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.models import cpu_fast, cpu_profile, loading, quantized
from kspec.engine.models.cpu_fast import FastPath, describe, to_fast_path
from kspec.engine.models.cpu_profile import CpuFacts
from kspec.engine.models.gguf_blocks import DECODERS
from kspec.engine.models.gguf_blocks import q8_0 as gguf_q8_0
from kspec.engine.models.quantized import (
    GROUP, TERM_SEPARATOR, CpuLinear, Int4Embedding, PackedCodes, Q4Codes, Q8Q8Term, TiledEmbedding, int4_kernel_available, load_q4,
    save_q4, weight_terms,
)
from kspec.engine.models.transformer import Transformer
from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers

needs_int4 = pytest.mark.skipif(not int4_kernel_available(), reason="this PyTorch has no int4 CPU kernel")


def _random_blocks(kind: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF blocks [rows, K/32 * bytes] with finite fp16 scales (and minima)."""
    rng = np.random.default_rng(seed)
    size = {"Q4_0": 18, "Q4_1": 20}[kind]
    blocks = rng.integers(0, 256, (rows, k // GROUP, size), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.05, (rows, k // GROUP)).astype(np.float16)[..., None].view(np.uint8)
    if kind == "Q4_1":
        blocks[..., 2:4] = rng.uniform(-0.3, 0.1, (rows, k // GROUP)).astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_codes_are_the_gguf_weights(kind: str) -> None:
    from gguf import GGMLQuantizationType, quants

    blocks = _random_blocks(kind, rows=48, k=96)
    expected = quants.dequantize(blocks, getattr(GGMLQuantizationType, kind))  # [48, 96] float32
    codes = DECODERS[kind](blocks)[0]
    assert codes.shape == (48, 96) and int(codes.codes.max()) <= 15
    torch.testing.assert_close(codes.dequantize(), torch.from_numpy(expected), atol=0, rtol=0)


def test_q8_0_is_two_exact_4bit_terms() -> None:
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, (40, 96 // GROUP, 34), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.05, (40, 96 // GROUP)).astype(np.float16)[..., None].view(np.uint8)
    blocks[..., 2:] = np.clip(blocks[..., 2:].view(np.int8), -127, 127).view(np.uint8)
    blocks = blocks.reshape(40, -1)
    expected = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType.Q8_0))  # [40, 96]
    high, low = gguf_q8_0(blocks)
    torch.testing.assert_close(high.dequantize() + low.dequantize(), expected, atol=0, rtol=0)
    assert weight_terms({"w#hi": high, "w#lo": low}, "w") == [high, low]


@needs_int4
@pytest.mark.parametrize("pack_rows", [4096, 64], ids=["whole", "in-blocks-of-64-rows"])
def test_int4_kernel_gives_the_codes_back_exactly(pack_rows: int, monkeypatch) -> None:
    monkeypatch.setattr(quantized, "PACK_ROWS", pack_rows)
    codes = DECODERS["Q4_1"](_random_blocks("Q4_1", rows=208, k=64, seed=1))[0]
    linear = CpuLinear([], [codes], None, int4_max_rows=1 << 20, int4_dtype=torch.float32)  # float32 group parameters
    weights_back = linear(torch.eye(64)).t()  # x = I -> W^T
    torch.testing.assert_close(weights_back, codes.dequantize(), atol=0, rtol=0)


def test_int4_embedding_rows_are_the_float32_table() -> None:
    """Looked-up rows of a Q8_0 table (two terms) and a Q4_1 one equal their float32 dequantization bit for bit."""
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (50, 64 // GROUP, 34), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(0.001, 0.05, (50, 64 // GROUP)).astype(np.float16)[..., None].view(np.uint8)
    blocks[..., 2:] = np.clip(blocks[..., 2:].view(np.int8), -127, 127).view(np.uint8)
    q8 = list(gguf_q8_0(blocks.reshape(50, -1)))
    q4 = [DECODERS["Q4_1"](_random_blocks("Q4_1", rows=50, k=64, seed=6))[0]]
    tokens = torch.tensor([[3, 49, 0], [7, 7, 21]])  # [B, T]
    for terms in (q8, q4):
        table = sum(t.dequantize() for t in terms)  # [V, D] float32
        got = Int4Embedding([PackedCodes.of(t) for t in terms])(tokens)  # [B, T, D]
        assert got.shape == (2, 3, 64) and got.dtype == torch.float32
        torch.testing.assert_close(got, table[tokens], atol=0, rtol=0)
    with pytest.raises(ValueError, match="one shape"):
        Int4Embedding([PackedCodes.of(q8[0]), PackedCodes.of(q4[0].permute_rows(torch.arange(49)))])


def test_cpu_weights_setting_chooses_the_dense_copy(monkeypatch) -> None:
    assert FastPath.for_weights("4bit").resolved_keep_dense() is False
    assert FastPath.for_weights("4bit+dense").resolved_keep_dense() is True
    for native in (True, False):
        with_facts(monkeypatch, native_bf16=native)
        assert FastPath.for_weights("auto", cpu_int4="torch").resolved_keep_dense() is native
    for amx in (True, False):  # kspec's kernel runs the layer loop, whose rows a copy would take off it: never
        with_facts(monkeypatch, native_bf16=True, amx=amx)
        assert FastPath.for_weights("auto", cpu_int4="kspec").resolved_keep_dense() is False
        assert FastPath.for_weights("4bit+dense", cpu_int4="kspec").resolved_keep_dense() is True  # a setting wins
    with pytest.raises(ValueError, match="cpu_weights"):
        EngineConfig(cpu_weights="int8")


def test_q4_file_round_trip(tmp_path) -> None:
    codes = {"a.weight": DECODERS["Q4_1"](_random_blocks("Q4_1", 32, 64))[0], "b.weight": Q4Codes.quantize(torch.randn(16, 32))}
    save_q4(codes, tmp_path / "q4.safetensors")
    back = load_q4(tmp_path / "q4.safetensors")
    assert set(back) == set(codes)
    for name, q4 in codes.items():
        assert torch.equal(back[name].codes, q4.codes)
        torch.testing.assert_close(back[name].dequantize(), q4.dequantize(), atol=0, rtol=0)


def _quantized_tied_model(seed: int) -> tuple[Transformer, dict[str, Q4Codes]]:
    """qwen2 (tied head) with 4-bit projections and a 4-bit embedding table, and those codes."""
    model, codes = quantized_model("qwen2", seed)
    assert model.args.tie_embeddings
    with torch.no_grad():
        table = model.model.embed_tokens.weight
        q4 = Q4Codes.quantize(table)
        table.copy_(q4.dequantize())
    return model, {**codes, "model.embed_tokens.weight": q4}


def _logits_along(model: Transformer, prompt: list[int], k: int, verify: int) -> list[torch.Tensor]:
    """Prefill logits, two decode steps at k branches, then one verification of k x verify rows."""
    with torch.inference_mode():
        cache = RaggedKVCache(model.cache_shape, 1, len(prompt), model.dtype)
        out = [model.logits(model(torch.tensor([prompt]), cache))[0]]  # [P, V]
        cache.advance(len(prompt))
        branches = BranchKVCache.from_prompt(cache, k, 2 + verify)
        for step in range(2):
            out.append(model.step(torch.arange(k)[:, None] + 3 * step + 1, branches))  # [k, V]
        out.append(model.logits(model(torch.arange(k * verify).view(k, verify) % 97 + 5, branches)))  # [k, T, V]
    return out


LOGIT_SHARE = {"torch": 0.03, "kspec": 0.08}  # of the logit range, per 4-bit kernel (measured: kspec up to 5.6 %)
@pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None or not quantized.int4_kernel_available(),
    reason="no C++ compiler or no int4 CPU kernel in this PyTorch: the PyTorch ops serve",
)
def test_kspecs_cpp_ops_build_where_a_compiler_is_present() -> None:
    """Every test of the C++ ops skips where they are not built; here a source that stops
    compiling fails the suite instead of skipping those tests."""
    assert cpu_layers.load(cache_root()) is not None, cpu_layers.unavailable_reason(cache_root())


needs_kspec_kernel = pytest.mark.skipif(cpu_layers.load_matmul(cache_root()) is None, reason="kspec's C++ ops are not built here")


@needs_int4
@pytest.mark.parametrize("kernel", [pytest.param("torch"), pytest.param("kspec", marks=needs_kspec_kernel)])
@pytest.mark.parametrize("family", ["llama", "qwen2", "starcoder2"])
@pytest.mark.parametrize(
    "path",
    [
        FastPath(int4_max_rows=1 << 20, keep_dense=True),
        FastPath(int4_max_rows=0, keep_dense=True, dense_dtype=torch.bfloat16),
        FastPath(int4_max_rows=8, keep_dense=True),
        FastPath(keep_dense=False),
    ],
    ids=["int4", "dense-bf16", "int4-up-to-8-rows", "int4-only"],
)
def test_fast_path_logits_within_tolerance(kernel: str, family: str, path: FastPath) -> None:
    reference, codes = quantized_model(family, seed=3)
    fast = to_fast_path(copy.deepcopy(reference), codes, dataclasses.replace(path, int4_kernel=kernel))
    linears = [m for m in fast.modules() if isinstance(m, CpuLinear)]
    assert linears and all(m.has_int4 for m in linears if m is not fast.lm_head)  # every projection has its 4-bit form
    assert fast.dtype == torch.float32  # embeddings, norms, attention, KV cache, head
    prompt = [(7 * i + 3) % 500 for i in range(24)]
    for want, got in zip(_logits_along(reference, prompt, 3, 5), _logits_along(fast, prompt, 3, 5)):
        scale = float(want.max() - want.min())
        assert scale > 1.0  # peaked enough to mean something
        assert float((got - want).abs().max()) <= LOGIT_SHARE[kernel] * scale


@needs_int4
def test_4bit_only_path_keeps_no_float_weights() -> None:
    """cpu_weights 4bit: no dense copy anywhere, the (tied) embedding and head from the 4-bit
    table; its lookups exact (the head's kernel form holds s and m in float16, which these do not
    fit: the table's own 4-bit terms), every logit within the fast path's tolerance, far fewer bytes."""
    reference, codes = _quantized_tied_model(seed=7)
    fast = to_fast_path(copy.deepcopy(reference), codes, FastPath(keep_dense=False))
    linears = [m for m in fast.modules() if isinstance(m, CpuLinear)]
    assert linears and all(m.has_int4 and not m.dense_names for m in linears)
    assert isinstance(fast.model.embed_tokens, Int4Embedding) and fast.dtype == torch.float32
    kernel = "kspec's 4-bit x 8-bit kernel" if FastPath().resolved_int4_kernel() == "kspec" else "PyTorch's int4 kernel"
    assert f"matmuls at every row count, {kernel}" in describe(fast) and "4-bit embedding" in describe(fast)
    tokens = torch.arange(40).view(2, 20) * 11 % 512
    torch.testing.assert_close(fast.model.embed_tokens(tokens), reference.model.embed_tokens(tokens), atol=0, rtol=0)
    prompt = [(7 * i + 3) % 500 for i in range(24)]
    for want, got in zip(_logits_along(reference, prompt, 3, 5), _logits_along(fast, prompt, 3, 5)):
        scale = float(want.max() - want.min())
        assert float((got - want).abs().max()) <= LOGIT_SHARE[FastPath().resolved_int4_kernel()] * scale

    def nbytes(model: torch.nn.Module) -> int:
        return sum(t.nbytes for t in [*model.parameters(), *model.buffers()])

    assert nbytes(fast) < nbytes(reference) / 4
    kept = to_fast_path(copy.deepcopy(reference), codes, FastPath(keep_dense=True, dense_dtype=torch.float32))
    assert isinstance(kept.model.embed_tokens, torch.nn.Embedding)  # the head's dense form needs the float table


@needs_int4
def test_4bit_only_load_never_reads_the_float_weights_the_codes_replace(tmp_path, monkeypatch) -> None:
    """cpu_weights 4bit: the projections' and the tied table's float weights stay unread (the
    load peaks at the model it keeps); the model is the one a full load turns into."""
    from model_factory import write_random_model
    from kspec.engine.models import hf_folder, tensor_file

    folder = write_random_model(tmp_path / "m", "qwen2")  # tied embedding
    full = hf_folder.load_transformer(folder, torch.float32)
    codes = {name: Q4Codes.quantize(tensor) for name, tensor in full.state_dict().items()
             if name.endswith("_proj.weight") or name == "model.embed_tokens.weight"}  # fmt: skip
    save_q4(codes, folder / quantized.Q4_FILE)
    read: list[str] = []
    original_get = tensor_file.TensorFile.get
    monkeypatch.setattr(tensor_file.TensorFile, "get", lambda self, name: read.append(name) or original_get(self, name))
    monkeypatch.setattr(loading, "fast_path_available", lambda: True)
    lean = loading.load_model(str(folder), EngineConfig(progress=False, cpu_weights="4bit")).model
    assert read and not set(read) & set(codes)  # norms and biases only
    assert not any(t.is_meta for t in [*lean.parameters(), *lean.buffers()])
    chosen = lean.kernel_choice.int4_kernel if lean.kernel_choice is not None else None  # timed at load: the same kernel here
    reference = to_fast_path(full, load_q4(folder / quantized.Q4_FILE), FastPath(keep_dense=False, int4_kernel=chosen))
    prompt = [(7 * i + 3) % 500 for i in range(24)]
    for want, got in zip(_logits_along(reference, prompt, 3, 5), _logits_along(lean, prompt, 3, 5)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    read.clear()
    loading.load_model(str(folder), EngineConfig(progress=False, cpu_weights="4bit+dense"))
    assert set(codes) <= set(read)  # the dense copy is the float weights themselves


needs_packing = pytest.mark.skipif(not quantized.packing_available(), reason="this PyTorch has no oneDNN")


@needs_packing
def test_packed_bfloat16_weights_multiply_as_plain_bfloat16_ones() -> None:
    """A bfloat16 dense form is one weight in oneDNN's layout (q, k and v concatenated): bit for
    bit the plain bfloat16 product, for a decode step, a verification and a prefill's rows."""
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 64, generator=generator) for n in (48, 16, 16)]
    linear = CpuLinear(parts, [], None, int4_max_rows=0, dense_dtype=torch.bfloat16)
    assert linear.packed is not None and not linear.dense_names and linear.dense_dtype == torch.bfloat16
    assert linear.dense_nbytes == 80 * 64 * 2
    weight = torch.cat(parts).to(torch.bfloat16)
    for shape in [(1, 1, 64), (4, 1, 64), (8, 5, 64), (1, 300, 64)]:
        x = torch.randn(*shape, generator=generator)
        got = linear(x)
        assert got.shape == (*shape[:-1], 80) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got, torch.nn.functional.linear(x.to(torch.bfloat16), weight), atol=0, rtol=0)
    assert "oneDNN layout" in repr(linear)


@pytest.mark.parametrize("kernel", ["torch", "kspec"])
def test_4bit_rows_default_to_the_crossover_of_the_kernel_and_dense_dtype(kernel: str, monkeypatch) -> None:
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        with_facts(monkeypatch, native_bf16=native)
        assert FastPath(int4_kernel=kernel).resolved_int4_max_rows() == cpu_profile.INT4_MAX_ROWS[(kernel, dtype)]
    assert FastPath(int4_max_rows=8, int4_kernel=kernel).resolved_int4_max_rows() == 8  # a setting wins
    assert FastPath(dense_dtype=torch.float32, int4_kernel=kernel).resolved_int4_max_rows() == cpu_profile.INT4_MAX_ROWS[(kernel, torch.float32)]
    # PyTorch's int4 kernel loses to the bfloat16 copy sooner than to float32; kspec's VNNI one later than PyTorch's
    assert cpu_profile.INT4_MAX_ROWS[("torch", torch.bfloat16)] < cpu_profile.INT4_MAX_ROWS[("torch", torch.float32)]
    assert cpu_profile.INT4_MAX_ROWS[("kspec", torch.bfloat16)] > cpu_profile.INT4_MAX_ROWS[("torch", torch.bfloat16)]


def test_cpu_vendor_family_reads_this_machine() -> None:
    facts = CpuFacts.here()
    if os.path.exists("/proc/cpuinfo") and platform.machine() == "x86_64":
        assert facts.vendor in ("AuthenticAMD", "GenuineIntel") and facts.family > 0
    else:
        assert (facts.vendor, facts.family) == ("", 0) or facts.family >= 0
    assert facts.amx <= facts.native_bf16  # AMX computes bfloat16


def test_the_int4_kernel_follows_the_setting_then_the_cpu(monkeypatch) -> None:
    assert FastPath.for_weights("auto", "auto", "kspec").resolved_int4_kernel() == "kspec"
    assert FastPath.for_weights("auto", "auto", "torch").resolved_int4_kernel() == "torch"
    with pytest.raises(ValueError, match="cpu_int4"):
        FastPath.for_weights("auto", "auto", "vnni")
    measured = [  # the build's instructions, the CPU: kspec's kernel only where measured faster (Zen 4, Zen 5)
        ("avx512-vnni", ("AuthenticAMD", 0x1A), "kspec"), ("avx512-vnni", ("AuthenticAMD", 0x19), "kspec"),
        ("avx512-vnni", ("AuthenticAMD", 0x17), "torch"),
        ("avx512-vnni", ("GenuineIntel", 6), "torch"), ("avx2", ("AuthenticAMD", 0x1A), "torch"), (None, ("AuthenticAMD", 0x1A), "torch"),
    ]
    for isa, (vendor, family), kernel in measured:
        with_facts(monkeypatch, capability="AVX512", matmul_isa=isa, vendor=vendor, family=family)
        assert FastPath().resolved_int4_kernel() == kernel, (isa, vendor, family)
    with_facts(monkeypatch, capability="AVX2", matmul_isa="avx2")
    assert FastPath().resolved_int4_kernel() == "kspec"
    with_facts(monkeypatch, matmul_isa="avx512-vnni", native_bf16=True, amx=True)  # measured on an Intel AMX VM
    assert FastPath().resolved_int4_kernel() == "kspec"
    with_facts(monkeypatch, matmul_isa=None, native_bf16=True, amx=True)  # no kspec build: PyTorch's
    assert FastPath().resolved_int4_kernel() == "torch"
    with_facts(monkeypatch, capability="DEFAULT")
    assert FastPath().resolved_int4_kernel() == "torch" and not cpu_fast.fast_path_available()


def with_facts(monkeypatch, **fields) -> CpuFacts:
    """Make CpuFacts.here() answer these facts (the rest: an AVX-512 CPU without BF16, AMX or a VNNI build)."""
    base = dict(capability="AVX512", matmul_isa=None, vendor="GenuineIntel", family=6, native_bf16=False, amx=False)
    facts = CpuFacts(**{**base, **fields})
    monkeypatch.setattr(CpuFacts, "here", classmethod(lambda cls: facts))
    return facts


@pytest.mark.parametrize("matches, profile", cpu_profile.PROFILES, ids=[p.name for _, p in cpu_profile.PROFILES])
def test_every_cpu_profile_row_is_reachable_and_agrees_with_the_dense_rule(matches, profile) -> None:
    """Each row is the first match for some CPU, names its measurement, and keeps a dense copy
    exactly where the rule for a hand-chosen kernel would (so a setting and a default never disagree)."""
    candidates = [
        CpuFacts(capability, isa, vendor, family, bf16, amx)
        for capability in ("AVX512", "AVX2", "DEFAULT") for isa in (None, "avx2", "avx512-vnni")
        for vendor, family in (("AuthenticAMD", 0x19), ("AuthenticAMD", 0x1A), ("AuthenticAMD", 0x17), ("GenuineIntel", 6))
        for bf16, amx in ((False, False), (True, False), (True, True))
        if (not bf16 or capability == "AVX512") and (not amx or vendor == "GenuineIntel")  # AMX: Intel's, with AVX-512
    ]  # fmt: skip
    firsts = [facts for facts in candidates if cpu_profile.profile_for(facts) is profile]
    assert firsts, f"no CPU reaches {profile.name!r}: an earlier row shadows it"
    assert profile.why and profile.measured_in.startswith("docs/measurements/")
    for facts in firsts:
        assert matches(facts)
        assert profile.dense_copy == cpu_profile.dense_pays(profile.int4_kernel, facts), (profile.name, facts)
    for path in profile.measured_in.split(", "):
        assert (Path(__file__).parents[3] / path).is_file(), path


needs_q8_head = pytest.mark.skipif(
    cpu_layers.load_q8_matmul(cache_root()) is None or cpu_layers.matmul_isa(cache_root()) not in cpu_profile.Q8Q8_ISAS,
    reason="kspec's 8-bit kernel is not built vectorized here",
)


@needs_q8_head
def test_a_table_tied_to_an_8bit_head_is_looked_up_in_the_heads_codes() -> None:
    """A Q8_0 table (as the default GGUF's) tied to the head: with kspec's kernel the head is one
    8-bit term and the embedding reads its codes, the file's weights exactly, no table of its own."""
    reference, codes = quantized_model("qwen2", seed=11)
    assert reference.args.tie_embeddings
    with torch.no_grad():
        table = reference.model.embed_tokens.weight  # [V, D]
        blocks = table.view(table.shape[0], -1, GROUP)  # [V, D/32, 32]
        d = (blocks.abs().amax(-1) / 127).half()  # [V, D/32], as a GGUF stores it
        q = torch.round(blocks / d.float().clamp_min(1e-8)[..., None]).clamp(-127, 127).to(torch.int8)
        raw = np.concatenate([d.numpy()[..., None].view(np.uint8), q.numpy().view(np.uint8)], axis=-1)  # [V, D/32, 34]
        high, low = gguf_q8_0(raw.reshape(table.shape[0], -1))
        table.copy_(high.dequantize() + low.dequantize())  # the file's d q
    name = "model.embed_tokens.weight"
    codes = {**codes, f"{name}{TERM_SEPARATOR}hi": high, f"{name}{TERM_SEPARATOR}lo": low}
    fast = to_fast_path(copy.deepcopy(reference), codes, FastPath(keep_dense=False, int4_kernel="kspec"))
    assert [type(t) for t in fast.lm_head.terms] == [Q8Q8Term]
    assert isinstance(fast.model.embed_tokens, TiledEmbedding) and "embedding from the head's 8-bit codes" in describe(fast)
    assert fast.head_cost is not None and fast.head_cost.max_rows is None  # a row's logits the same in any call: looked ahead
    tokens = torch.arange(60).view(3, 20) * 13 % table.shape[0]
    with torch.inference_mode():
        torch.testing.assert_close(fast.model.embed_tokens(tokens), table[tokens], atol=0, rtol=0)
    prompt = [(7 * i + 3) % 500 for i in range(24)]
    for want, got in zip(_logits_along(reference, prompt, 3, 5), _logits_along(fast, prompt, 3, 5)):
        scale = float(want.max() - want.min())
        assert float((got - want).abs().max()) <= LOGIT_SHARE["kspec"] * scale


@needs_int4
@needs_packing
def test_packed_bfloat16_head_frees_the_float_table() -> None:
    """With a bfloat16 dense form the tied head keeps a packed copy for many rows, so the
    embedding is looked up from its 4-bit terms (exact) and no float32 table is kept."""
    reference, codes = _quantized_tied_model(seed=9)
    fast = to_fast_path(
        copy.deepcopy(reference), codes, FastPath(int4_max_rows=2, keep_dense=True, dense_dtype=torch.bfloat16, int4_kernel="torch")
    )
    assert fast.lm_head.packed is not None and fast.lm_head.has_int4
    assert isinstance(fast.model.embed_tokens, Int4Embedding)
    assert "up to 2 rows, dense bfloat16 above, PyTorch's int4 kernel, 4-bit embedding" in describe(fast)
    assert fast.head_cost is None  # not kspec's kernel: acceptance computes the head position by position
    prompt = [(7 * i + 3) % 500 for i in range(24)]
    for want, got in zip(_logits_along(reference, prompt, 3, 5), _logits_along(fast, prompt, 3, 5)):
        scale = float(want.max() - want.min())
        assert float((got - want).abs().max()) <= LOGIT_SHARE[FastPath().resolved_int4_kernel()] * scale


@needs_int4
def test_many_rows_run_the_loaded_float32_weights() -> None:
    """Above int4_max_rows the fast path is the float32 model (its own weights, no copy)."""
    reference, codes = quantized_model("qwen2", seed=5)
    model = copy.deepcopy(reference)
    attention = model.model.layers[0].self_attn
    loaded = [attention.q_proj.weight.data_ptr(), attention.k_proj.weight.data_ptr(), attention.v_proj.weight.data_ptr()]
    fast = to_fast_path(model, codes, FastPath(int4_max_rows=0, keep_dense=True, dense_dtype=torch.float32))
    assert [w.data_ptr() for w in attention.qkv_proj.dense_parts] == loaded  # the loaded tensors themselves
    prompt = [(3 * i + 2) % 500 for i in range(20)]
    for want, got in zip(_logits_along(reference, prompt, 2, 4), _logits_along(fast, prompt, 2, 4)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_fused_projections_keep_float32_exact() -> None:
    """Fusing q/k/v and gate/up (without bfloat16) changes nothing beyond float32 rounding."""
    reference, _ = quantized_model("llama", seed=4)
    fused = copy.deepcopy(reference)
    for block in fused.model.layers:
        a, m = block.self_attn, block.mlp
        qkv = torch.nn.Linear(a.q_proj.in_features, 1, bias=False)
        qkv.weight = torch.nn.Parameter(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        gate_up = torch.nn.Linear(m.gate_proj.in_features, 1, bias=False)
        gate_up.weight = torch.nn.Parameter(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        a.fuse(qkv, a.o_proj)
        m.fuse(gate_up, m.down_proj)
    prompt = [(5 * i + 1) % 500 for i in range(20)]
    for want, got in zip(_logits_along(reference, prompt, 2, 4), _logits_along(fused, prompt, 2, 4)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_auto_chooses_the_fast_path_only_where_it_runs(monkeypatch) -> None:
    monkeypatch.setattr(loading, "fast_path_available", lambda: True)
    assert loading.Compute.choose(EngineConfig()) == loading.Compute(torch.float32, True)
    assert loading.Compute.choose(EngineConfig(dtype="float32")) == loading.Compute(torch.float32, False)
    assert loading.Compute.choose(EngineConfig(dtype="bfloat16")) == loading.Compute(torch.bfloat16, False)
    monkeypatch.setattr(loading, "fast_path_available", lambda: False)
    assert loading.Compute.choose(EngineConfig()) == loading.Compute(torch.float32, False)
    assert EngineConfig().dtype == "auto"


@needs_int4
@pytest.mark.skipif(not cpu_fast.fast_path_available(), reason="no AVX-512: auto is float32 here")
def test_default_model_fast_path_agrees_with_float32(default_engine) -> None:
    """Teacher-forced on float32 greedy continuations (no divergence compounding): the argmax of
    the fast path's decode steps (4-bit kernel, one row) matches float32's at >= 85% of positions,
    and where it does not, float32 rates the fast path's token within half a logit of its own: a
    near tie the 8-bit activations' rounding may tip either way (which way moves with the CPU's
    float32 kernels: 86/96 on an Intel AMX VM, the largest gap 0.43)."""
    reference = default_engine.target
    fast = loading.load_model(None, EngineConfig(progress=False))
    assert "int4" in fast.compute  # the GGUF's 4-bit weights are in use
    source = inspect.getsource(json.decoder)
    agree = total = 0
    worst_gap = 0.0  # float32's best logit minus its logit of the fast path's token
    with torch.inference_mode():
        for start in (0, 3000, 7000):
            prompt = reference.tokenizer.encode(source[start : start + 1500])[:256]
            caches = {}
            for name, target in (("float32", reference), ("auto", fast)):
                cache = RaggedKVCache(target.model.cache_shape, 1, len(prompt), target.model.dtype)
                target.model(torch.tensor([prompt[:-1]]), cache)  # the last prompt token is the first step's
                cache.advance(len(prompt) - 1)
                caches[name] = BranchKVCache.from_prompt(cache, 1, 40)
            token = prompt[-1]
            for _ in range(32):
                want = reference.model.step(torch.tensor([[token]]), caches["float32"])[0]
                got = fast.model.step(torch.tensor([[token]]), caches["auto"])[0]
                agree += int(got.argmax() == want.argmax())
                worst_gap = max(worst_gap, float(want.max() - want.flatten()[got.argmax()]))
                total += 1
                token = int(want.argmax())
    assert agree / total >= 0.85, f"top-1 agreement {agree}/{total}"
    assert worst_gap <= 0.5, f"the fast path picked a token float32 rates {worst_gap:.3f} below its best"
