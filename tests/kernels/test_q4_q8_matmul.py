"""kspec's 4-bit x 8-bit CPU matmul (kernels/csrc/q4_q8_matmul.cpp, engine/models/quantized.py
Q4Q8Term) against the arithmetic it documents, computed here in float64 from the same codes:
x quantized to 8 bits per block of 32 (d = max|x| / 127, a = round(x / d)), then
y = sum_b s d (q . a) + m sum(x). Only the order of float32 sums differs: 1e-5 of the scale."""

from __future__ import annotations

import os

import pytest
import torch

from kspec.engine.models.quantized import GROUP, CpuLinear, Q4Codes, Q4Q8Term
from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers

matmul = cpu_layers.load_matmul(cache_root())
pytestmark = pytest.mark.skipif(matmul is None, reason=cpu_layers.unavailable_reason(cache_root()) or "not built")


def _codes(n: int, k: int, seed: int) -> Q4Codes:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
    scale = (torch.rand(n, k // GROUP, generator=generator) * 0.02 + 0.001).half().float()  # float16 values, as a GGUF's
    minimum = (torch.randn(n, k // GROUP, generator=generator) * 0.05).half().float()
    return Q4Codes(codes, scale, minimum + 8 * scale)


def _documented(x: torch.Tensor, codes: Q4Codes) -> torch.Tensor:
    m, k = x.shape
    blocks = x.view(m, k // GROUP, GROUP)  # [M, K/32, 32]
    d = blocks.abs().amax(-1) / 127  # [M, K/32] float32, as the kernel computes it
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    a = torch.round(blocks * inverse[..., None]).double()  # [M, K/32, 32]
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


def test_the_build_names_the_instructions_this_cpu_has() -> None:
    """The AVX-512 VNNI code path is built where the compiler targets it (-march=native), AVX2's
    elsewhere; the tests above then check the one this machine runs."""
    flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
    isa = cpu_layers.matmul_isa(cache_root())
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        assert isa == "avx512-vnni"
    elif {"avx2", "fma", "f16c"} <= flags:
        assert isa == "avx2"
    else:
        assert isa in ("avx512-vnni", "avx2", "scalar")


def test_rows_not_a_multiple_of_four_are_padded_and_cut() -> None:
    codes = _codes(7, 64, seed=1)
    term = Q4Q8Term(codes, matmul)  # type: ignore[arg-type]
    assert term.codes.shape == (2, 2, 4, 16) and term.params.shape == (2, 2, 2, 4)
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
