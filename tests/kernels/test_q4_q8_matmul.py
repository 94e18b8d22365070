"""kspec's 4-bit x 8-bit CPU matmul (kernels/csrc/q4_q8_matmul.cpp, engine/models/quantized.py
Q4Q8Term) against the arithmetic it documents, computed here in float64 from the same codes:
x quantized to 8 bits per block of 32 (d = max|x| / 127, a = round(x / d)), then
y = sum_b s d (q . a) + m sum(x). Only the order of float32 sums differs: 1e-5 of the scale.
Its 8-bit form (q8_q8_matmul, Q8Q8Term: a GGUF Q8_0 weight) likewise: y = sum_b s d (q . a)."""

from __future__ import annotations

import os

import pytest
import torch

import numpy as np

from kspec.engine.models.quantized import GROUP, CpuLinear, Q4Codes, Q4Q8Term, Q8Q8Term, TiledEmbedding, eight_bit_codes, symmetric_zero, tiled_rows
from kspec.engine.models.gguf_blocks import q8_0 as gguf_q8_0
from kspec.engine.models.resolve import cache_root
from kspec.engine.models.cpu_profile import VNNI_ISA
from kspec.kernels import cpu_layers
from kspec.kernels.cpu_cap import CPU_VARIABLE

matmul = cpu_layers.load_matmul(cache_root())
matmul8 = cpu_layers.load_q8_matmul(cache_root())
pytestmark = pytest.mark.skipif(matmul is None, reason=cpu_layers.unavailable_reason(cache_root()) or "not built")


def _codes(n: int, k: int, seed: int) -> Q4Codes:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
    scale = (torch.rand(n, k // GROUP, generator=generator) * 0.02 + 0.001).half().float()  # float16 values, as a GGUF's
    minimum = (torch.randn(n, k // GROUP, generator=generator) * 0.05).half().float()
    return Q4Codes(codes, scale, minimum + 8 * scale)


def _quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> its blocks [M, K/32, 32], a [M, K/32, 32] (float64 integers), d [M, K/32]."""
    m, k = x.shape
    blocks = x.view(m, k // GROUP, GROUP)  # [M, K/32, 32]
    d = blocks.abs().amax(-1) / 127  # [M, K/32] float32, as the kernel computes it
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return blocks, torch.round(blocks * inverse[..., None]).double(), d


def _documented(x: torch.Tensor, codes: Q4Codes) -> torch.Tensor:
    k = x.shape[1]
    blocks, a, d = _quantized(x)
    q = codes.codes.view(-1, k // GROUP, GROUP).double()  # [N, K/32, 32]
    s, minimum = codes.scale.double(), (codes.zero - 8 * codes.scale).double()  # [N, K/32]
    dots = torch.einsum("mbj,nbj->mnb", a, q)  # [M, N, K/32] exact integers
    return (torch.einsum("mnb,mb,nb->mn", dots, d.double(), s) + blocks.double().sum(-1) @ minimum.t()).float()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 11, 17, 40])  # every row tile of both code paths
@pytest.mark.parametrize(("n", "k"), [(96, 576), (36, 64), (8, 1536)])
def test_matmul_is_the_documented_arithmetic(rows: int, n: int, k: int) -> None:
    codes = _codes(n, k, seed=rows + n)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k + rows)) * 3
    x[0, :GROUP] = 0.0  # an all-zero block: d = 0
    got = Q4Q8Term(codes, matmul)(x)  # type: ignore[arg-type]
    want = _documented(x, codes)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=0)


def _cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo lists (none where there is no such file)."""
    return set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()


def test_the_build_names_the_instructions_this_cpu_has() -> None:
    """The AVX-512 VNNI code path is built where the compiler targets it (-march=native), AVX2's
    elsewhere; the tests above then check the one this machine runs."""
    if os.environ.get(cpu_layers.MARCH_VARIABLE):
        pytest.skip("built for another instruction set on purpose (tests/kernels/test_other_isas.py checks which)")
    flags = _cpu_flags()
    isa = cpu_layers.matmul_isa(cache_root())
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        assert isa == "avx512-vnni"
    elif {"avx2", "fma", "f16c"} <= flags:
        assert isa == "avx2"
    else:
        assert isa in ("avx512-vnni", "avx2", "scalar")


def test_rows_not_a_multiple_of_sixteen_are_padded_and_cut() -> None:
    codes = _codes(23, 64, seed=1)
    term = Q4Q8Term(codes, matmul)  # type: ignore[arg-type]
    assert term.codes.shape == (2, 2, 4, 16, 4) and term.params.shape == (2, 2, 2, 16)
    x = torch.randn(3, 64)
    torch.testing.assert_close(term(x), _documented(x, codes), atol=1e-4, rtol=0)


def test_a_linear_on_the_kernel_is_within_8bit_rounding_of_the_float_weights() -> None:
    """CpuLinear with kspec's kernel: float32 out, within the activations' rounding (each term
    of a block's dot moves by at most d / 2 = max|x| / 254) of x W^T in float64."""
    codes = _codes(64, 256, seed=5)
    linear = CpuLinear([], [codes], None, int4_max_rows=1 << 20, q4q8_matmul=matmul)
    x = torch.randn(5, 256)
    got = linear(x)
    want = (x.double() @ codes.dequantize().double().t()).float()
    assert got.dtype == torch.float32
    bound = (x.abs().view(5, -1, GROUP).amax(-1) / 254).repeat_interleave(GROUP, -1) @ codes.dequantize().abs().t()  # [5, 64]
    assert bool(((got - want).abs() <= bound + 1e-5).all())
    with pytest.raises(RuntimeError, match="x must be"):
        matmul(x.double(), linear.terms[0].codes, linear.terms[0].params)  # type: ignore[misc]


def _q8_0_blocks(n: int, k: int, seed: int) -> np.ndarray:
    """A GGUF Q8_0 tensor's bytes [N, K/32 * 34]: float16 d, then 32 int8 q in -127..127."""
    generator = np.random.default_rng(seed)
    d = (generator.random((n, k // GROUP, 1)) * 0.02 + 0.001).astype(np.float16)
    q = generator.integers(-127, 128, (n, k // GROUP, GROUP)).astype(np.int8)
    return np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=-1).reshape(n, -1)


def _documented_q8(x: torch.Tensor, blocks: np.ndarray) -> torch.Tensor:
    n, k = blocks.shape[0], x.shape[1]
    per_block = blocks.reshape(n, k // GROUP, 34)
    d_w = torch.from_numpy(per_block[..., :2].copy().view(np.float16)[..., 0].astype(np.float64))  # [N, K/32]
    q = torch.from_numpy(per_block[..., 2:].copy().view(np.int8).astype(np.float64))  # [N, K/32, 32]
    _, a, d = _quantized(x)
    dots = torch.einsum("mbj,nbj->mnb", a, q)  # [M, N, K/32] exact integers
    return torch.einsum("mnb,mb,nb->mn", dots, d.double(), d_w).float()


needs_matmul8 = pytest.mark.skipif(matmul8 is None, reason="kspec's C++ ops not built")


@needs_matmul8
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 40])  # row tiles of 1-8 rows and their remainders
@pytest.mark.parametrize(("n", "k"), [(96, 576), (7, 64)])
def test_the_8bit_form_is_llama_cpps_q8_0_dot(rows: int, n: int, k: int) -> None:
    """A Q8_0 weight, split into two 4-bit terms as a GGUF loads it and joined back into one
    8-bit term: y = sum_b d_w d_x (q . a), with q the file's own int8 codes."""
    blocks = _q8_0_blocks(n, k, seed=rows + n)
    joined = eight_bit_codes(gguf_q8_0(blocks))
    assert joined is not None
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k + rows)) * 3
    x[0, :GROUP] = 0.0  # an all-zero block: d = 0
    term = Q8Q8Term(*joined, matmul8)  # type: ignore[arg-type]
    got, want = term(x), _documented_q8(x, blocks)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=0)


@needs_matmul8
def test_an_embedding_tied_to_the_8bit_head_looks_rows_up_in_its_codes() -> None:
    """Rows of a Q8_0 table read from the head's tiles (19 rows: the last tile padded) equal the
    file's float32 weights d q bit for bit."""
    blocks = _q8_0_blocks(19, 64, seed=8)
    terms = gguf_q8_0(blocks)
    table = sum(t.dequantize() for t in terms)  # [V, D] float32, the file's d q
    head = Q8Q8Term(*eight_bit_codes(terms), matmul8)  # type: ignore[misc]
    embedding = TiledEmbedding([head])
    tokens = torch.tensor([[3, 18, 0], [16, 7, 15]])  # [B, T]: both tiles, first and last lanes
    got = embedding(tokens)  # [B, T, D]
    assert got.shape == (2, 3, 64) and got.dtype == torch.float32 and embedding.num_embeddings == 19
    torch.testing.assert_close(got, table[tokens], atol=0, rtol=0)
    assert list(embedding.buffers()) == [head.codes, head.params]  # the head's, no copy


@needs_matmul8
def test_a_q8_0_linear_takes_one_8bit_term_and_other_terms_stay_4bit() -> None:
    q8_terms = gguf_q8_0(_q8_0_blocks(12, 64, seed=3))
    joined = CpuLinear([], q8_terms, None, int4_max_rows=1 << 20, q4q8_matmul=matmul, q8q8_matmul=matmul8)
    split = CpuLinear([], q8_terms, None, int4_max_rows=1 << 20, q4q8_matmul=matmul)
    assert [type(t) for t in joined.terms] == [Q8Q8Term] and [type(t) for t in split.terms] == [Q4Q8Term, Q4Q8Term]
    x = torch.randn(4, 64)
    weights = sum(t.dequantize() for t in q8_terms).double()  # [12, 64] the file's d q
    want = x.double() @ weights.t()
    # within the activations' 8-bit rounding (max|x| / 254 per weight), and closer than the two
    # 4-bit terms, whose minimum term multiplies the unrounded block sums by -128 d
    bound = (x.abs().view(4, -1, GROUP).amax(-1) / 254).repeat_interleave(GROUP, -1).double() @ weights.abs().t()  # [4, 12]
    joined_error, split_error = (joined(x) - want).abs(), (split(x) - want).abs()
    assert bool((joined_error <= bound + 1e-5).all())
    assert float(joined_error.max()) < float(split_error.max())
    q4 = CpuLinear([], [_codes(12, 64, seed=4)], None, int4_max_rows=1 << 20, q4q8_matmul=matmul, q8q8_matmul=matmul8)
    assert [type(t) for t in q4.terms] == [Q4Q8Term]
    not_q8 = [q8_terms[0], _codes(12, 64, seed=5)]  # two terms that are not one Q8_0 weight
    assert eight_bit_codes(not_q8) is None


matmul5 = cpu_layers.load_q5_matmul(cache_root())


@needs_matmul8
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 40])
@pytest.mark.parametrize(("n", "k"), [(96, 576), (7, 64)])
def test_the_5bit_form_is_the_8bit_form_on_5bit_codes(rows: int, n: int, k: int) -> None:
    """5-bit codes (a Q5_0 / Q5_1 / Q5_K weight) in the 5-bit layout give the 8-bit form's
    outputs bit for bit: the same integer dots and float steps, from 5 bits a weight."""
    from kspec.engine.models.quantized import Q5Q8Term

    generator = torch.Generator().manual_seed(rows * 7 + n)
    codes = torch.randint(0, 32, (n, k), dtype=torch.uint8, generator=generator)
    codes[0, :GROUP] = 31  # every fifth bit of a block set
    codes[-1, GROUP:] = 0
    scale = torch.rand(n, k // GROUP, generator=generator) * 0.01
    minimum = -16 * scale + torch.randn(n, k // GROUP, generator=generator) * 0.001
    x = torch.randn(rows, k, generator=generator) * 2
    five = Q5Q8Term(codes, scale, minimum, matmul5)
    eight = Q8Q8Term(codes, scale, minimum, matmul8)
    assert five.codes.shape[2] == 5 and five.nbytes < 0.7 * eight.nbytes
    if cpu_layers.matmul_isa(cache_root()) == VNNI_ISA:  # the same loop over either layout
        torch.testing.assert_close(five(x), eight(x), atol=0, rtol=0)
    else:  # AVX2's 5-bit loop or the generic one: float32 order only
        torch.testing.assert_close(five(x), eight(x), atol=1e-5 * float(eight(x).abs().max()), rtol=0)
    dequantized = (codes.float().view(n, -1, GROUP) * scale.half().float()[..., None] + minimum.half().float()[..., None]).view(n, k)
    want = x.double() @ dequantized.double().t()
    bound = (x.abs().view(rows, -1, GROUP).amax(-1) / 254).repeat_interleave(GROUP, -1).double() @ dequantized.abs().double().t()
    assert bool(((five(x) - want).abs() <= bound + 1e-5).all())
    assert bool(((eight(x) - want).abs() <= bound + 1e-5).all())  # any minimum, on every ISA's 8-bit loop
    with pytest.raises(ValueError, match="0..31"):
        Q5Q8Term(codes + 32, scale, minimum, matmul5)


@needs_matmul8
def test_a_linear_takes_the_5bit_form_only_for_5bit_codes() -> None:
    from kspec.engine.models.gguf_blocks import eight_bit_numpy
    from kspec.engine.models.quantized import Q5Q8Term

    rng = np.random.default_rng(5)
    five_bit = eight_bit_numpy(rng.integers(0, 32, (16, 64)), rng.uniform(0.001, 0.01, (16, 2)), rng.uniform(-0.1, 0, (16, 2)))
    eight_bit = eight_bit_numpy(rng.integers(0, 256, (16, 64)), rng.uniform(0.001, 0.01, (16, 2)), rng.uniform(-0.1, 0, (16, 2)))
    kernels = dict(q4q8_matmul=matmul, q8q8_matmul=matmul8, q5q8_matmul=matmul5)
    assert [type(t) for t in CpuLinear([], five_bit, None, 1 << 20, **kernels).terms] == [Q5Q8Term]
    assert [type(t) for t in CpuLinear([], eight_bit, None, 1 << 20, **kernels).terms] == [Q8Q8Term]
    without = dict(q4q8_matmul=matmul, q8q8_matmul=matmul8)  # a build whose 5-bit loop is not vectorized
    assert [type(t) for t in CpuLinear([], five_bit, None, 1 << 20, **without).terms] == [Q8Q8Term]


matmul6 = cpu_layers.load_q6_matmul(cache_root())


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 17, 40])
@pytest.mark.parametrize(("n", "k"), [(96, 576), (7, 64)])
def test_the_6bit_form_is_the_documented_arithmetic_on_each_half_block(rows: int, n: int, k: int) -> None:
    """6-bit codes with a scale per 16 weights (a Q6_K weight, exactly): y = sum_b d (s0 (u . a -
    32 sum a) over weights 0 .. 15 + s1 (...) over 16 .. 31), computed here in float64 from the
    same codes; only the float32 order differs. Padded rows (n = 7) give nothing."""
    from kspec.engine.models.quantized import Q6Q8Term, SixBitCodes

    generator = torch.Generator().manual_seed(rows * 5 + n)
    codes = torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=generator)
    codes[0, :GROUP] = 63  # every high bit of a block set
    codes[-1, GROUP:] = 0
    scale = ((torch.rand(n, k // 16, generator=generator) - 0.5) * 0.02).half().float()  # float16 values: the kernel's
    x = torch.randn(rows, k, generator=generator) * 2
    x[0, :GROUP] = 0.0  # an all-zero block: d = 0
    six = Q6Q8Term(SixBitCodes(codes, scale), matmul6)  # type: ignore[arg-type]
    assert six.codes.shape[2] == 6 and six.nbytes == (n + -n % 16) * k * 7 // 8  # 6 bits of codes, 1 of scales
    _, a, d = _quantized(x)
    u = codes.view(n, k // 16, 16).double() - 32  # [N, K/16, 16]
    halves = a.view(rows, k // 16, 16)  # [M, K/16, 16]
    dots = torch.einsum("mhj,nhj->mnh", halves, u)  # [M, N, K/16] exact integers
    want = torch.einsum("mnh,mh,nh->mn", dots, d.double().repeat_interleave(2, -1), scale.double())
    torch.testing.assert_close(six(x).double(), want, atol=1e-5 * float(want.abs().max()), rtol=0)
    dequantized = SixBitCodes(codes, scale).dequantize().double()
    bound = (x.abs().view(rows, -1, GROUP).amax(-1) / 254).repeat_interleave(GROUP, -1).double() @ dequantized.abs().t()
    assert bool(((six(x) - x.double() @ dequantized.t()).abs() <= bound + 1e-5).all())


# Every form's op over codes of its layout (random bytes are valid codes and high-bit masks for each)
FORM_OPS = {bits: getattr(torch.ops.kspec, f"q{bits}_q8_matmul") for bits in (4, 5, 6, 8)} if matmul is not None else {}


@needs_matmul8
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("rows", [7, 9, 16, 17, 31, 40])  # AMX's groups of 16, the VNNI loop's remainders, AVX2's groups of 3 to 6
def test_rows_multiplied_together_are_the_rows_alone_bit_for_bit(bits: int, rows: int) -> None:
    """The loops a row count picks (AMX's groups of 16, the VNNI loop's 8 or 12 a pass, AVX2's
    unpacked scratch in groups of 3 to 6 rows, one row's two chains) add the same exact integer
    sums and scale them in one order: the same float32 bits."""
    n, k = 48, 1536
    generator = torch.Generator().manual_seed(bits * 100 + rows)
    codes = torch.randint(0, 256, (n // 16, k // GROUP, bits, 16, 4), generator=generator, dtype=torch.uint8)
    params = (torch.rand(n // 16, k // GROUP, 2, 16, generator=generator) * 0.02).half()
    x = torch.randn(rows, k, generator=generator) * 3
    together = FORM_OPS[bits](x, codes, params)  # [rows, n]
    alone = torch.cat([FORM_OPS[bits](x[r : r + 1], codes, params) for r in range(rows)])
    assert torch.equal(together, alone)


def test_the_build_multiplies_on_amx_where_the_cpu_has_it() -> None:
    """A native build on a CPU with AMX's int8 tiles takes groups of 16 rows there (csrc/q4q8/amx.h);
    elsewhere, or built for a lesser -march, no row count does."""
    native = not os.environ.get(cpu_layers.MARCH_VARIABLE) and not os.environ.get(CPU_VARIABLE)
    amx_rows = cpu_layers.matmul_amx_rows(cache_root())
    assert amx_rows == (16 if native and {"amx_tile", "amx_int8", "avx512_vnni"} <= _cpu_flags() else 0)


@needs_matmul8
@pytest.mark.parametrize("bits", [4, 5, 8])
@pytest.mark.parametrize("rows", [1, 3, 9, 16, 17, 40])  # one row's chains, the VNNI loop's passes, AMX's groups and remainders
def test_a_symmetric_forms_scales_alone_give_the_pairs_bits(bits: int, rows: int) -> None:
    """Params [N/16, K/32, 1, 16] (s alone) multiply as the pairs [.., 2, 16] with m = -2^(bits - 1) s,
    bit for bit, on every loop a row count picks."""
    n, k = 48, 1536
    generator = torch.Generator().manual_seed(bits * 10 + rows)
    codes = torch.randint(0, 256, (n // 16, k // GROUP, bits, 16, 4), generator=generator, dtype=torch.uint8)
    scales = ((torch.rand(n // 16, k // GROUP, 1, 16, generator=generator) - 0.5) * 0.02).half()
    pairs = torch.cat([scales, (symmetric_zero(bits) * scales.float()).half()], dim=2)
    assert torch.equal(pairs[:, :, 1].float(), symmetric_zero(bits) * scales[:, :, 0].float())  # exact in float16
    x = torch.randn(rows, k, generator=generator) * 3
    x[0, :GROUP] = 0.0  # an all-zero block: d = 0
    assert torch.equal(FORM_OPS[bits](x, codes, scales), FORM_OPS[bits](x, codes, pairs))


@needs_matmul8
def test_the_6bit_forms_params_are_never_one_scale_a_block() -> None:
    codes = torch.zeros(1, 2, 6, 16, 4, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"\[N/16, K/32, 2, 16\]"):
        FORM_OPS[6](torch.randn(1, 64), codes, torch.ones(1, 2, 1, 16, dtype=torch.float16))


@needs_matmul8
@pytest.mark.parametrize(("kind", "bits_per_weight"), [("Q4_0", 4.5), ("Q5_0", 5.5), ("Q8_0", 8.5)])
def test_a_symmetric_gguf_weight_is_held_in_the_files_own_bytes(kind: str, bits_per_weight: float) -> None:
    """Q4_0, Q5_0 and Q8_0 weights (one d a block, codes centred) keep their s alone: the kernel reads
    the file's bits a weight, and multiplies and looks rows up as the file's d (q - zero)."""
    from gguf import GGMLQuantizationType, quants

    from kspec.engine.models.gguf_blocks import tensor_terms

    n, k = 40, 256  # 40 rows: the last tile padded (its s 0, symmetric too)
    weight = np.random.default_rng(7).standard_normal((n, k)).astype(np.float32)
    data = quants.quantize(weight, GGMLQuantizationType[kind])
    file_weights = torch.from_numpy(quants.dequantize(data, GGMLQuantizationType[kind]).reshape(n, k).astype(np.float32))
    kernels = dict(q4q8_matmul=matmul, q8q8_matmul=matmul8, q5q8_matmul=matmul5)
    (term,) = CpuLinear([], tensor_terms(data, kind, (n, k)), None, 1 << 20, **kernels).terms
    assert term.params.shape == (3, k // GROUP, 1, 16)
    assert term.nbytes * 8 == pytest.approx(bits_per_weight * 48 * k)  # 48 rows: 3 tiles of 16
    torch.testing.assert_close(tiled_rows(term, torch.arange(n)), file_weights, atol=0, rtol=0)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1))
    bound = (x.abs().view(5, -1, GROUP).amax(-1) / 254).repeat_interleave(GROUP, -1).double() @ file_weights.abs().double().t()
    assert bool(((term(x) - x.double() @ file_weights.double().t()).abs() <= bound + 1e-5).all())

