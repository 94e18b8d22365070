"""The Triton kernel (kernels/triton_bifurcated.py) against the reference.

Where each group runs:
  * always: safe import, clear errors, split planning;
  * triton installed (``kspec[gpu]``), no GPU needed: the kernels compile to sm_90 cubins;
  * ``TRITON_INTERPRET=1`` with triton installed: the kernels run on CPU in Triton's
    interpreter (fp32 and fp16; the interpreter's tl.dot mishandles bf16);
  * CUDA + triton: the kernels on the GPU, fp32 / bf16 / fp16.

Tolerances vs the reference: fp32 atol 2e-5 rtol 2e-4 (IEEE fp32 dots, other summation
order); fp16 atol 4e-3 rtol 4e-3; bf16 atol 2e-2 rtol 2e-2 (probabilities are rounded to
the input type before P @ V, as in FlashAttention).
"""

from __future__ import annotations

import os

import pytest
import torch

from attention_cases import CASES, make_case
from kspec.kernels import triton_bifurcated as tb
from kspec.kernels.bifurcated import bifurcated_attention
from kspec.kernels.contract import Dims
from kspec.kernels.reference import reference_bifurcated_attention

KERNEL_TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()

needs_triton = pytest.mark.skipif(not tb.TRITON_AVAILABLE, reason="triton not installed (pip install 'kspec[gpu]')")
needs_interpreter = pytest.mark.skipif(
    not (tb.TRITON_AVAILABLE and INTERPRET),
    reason="runs the kernels on CPU only with triton installed and TRITON_INTERPRET=1",
)
needs_gpu = pytest.mark.skipif(
    not (tb.TRITON_AVAILABLE and HAS_CUDA and not INTERPRET),
    reason="needs a CUDA GPU and triton (pip install 'kspec[gpu]')",
)

# A case with several prefix and several branch splits (capacity > BRANCH_SPLIT_KEYS).
MULTI_SPLIT = (3, 4, 2, 2, 16, 130, 1100, [1100, 700, 30], None)


def _check(case: tuple, dtype: torch.dtype, device: str, sm_count: int, window: int | None) -> None:
    tensors = [t.to(device) for t in case]
    out = tb.launch(*tensors, None, window, sm_count)
    want = reference_bifurcated_attention(*case, sliding_window=window)
    assert out.dtype == dtype and out.shape == want.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().float(), want.float(), **KERNEL_TOL[dtype])


def test_import_is_safe_and_errors_are_clear() -> None:
    case = make_case(2, 4, 2, 1, 16, 8, 4, [4, 2])
    if not tb.TRITON_AVAILABLE:
        with pytest.raises(RuntimeError, match="triton is not installed"):
            tb.triton_bifurcated_attention(*case)
    else:
        with pytest.raises(RuntimeError, match="needs CUDA tensors"):
            tb.triton_bifurcated_attention(*case)


@pytest.mark.parametrize(
    "dims",
    [Dims(16, 32, 1, 128, 32, 8192, 64), Dims(16, 9, 1, 64, 3, 8192, 64), Dims(4, 9, 5, 64, 3, 100, 3000),
     Dims(1, 2, 1, 16, 1, 1, 1), Dims(4, 9, 1, 64, 3, 0, 0)],
)
@pytest.mark.parametrize("sm_count", [1, 132])
def test_split_plan_covers_every_key_once(dims: Dims, sm_count: int) -> None:
    p_splits, p_len, b_splits, b_len = tb.plan_splits(dims, sm_count)
    for total, splits, length, cap in ((dims.prefix, p_splits, p_len, tb.MAX_PREFIX_SPLITS),
                                       (dims.capacity, b_splits, b_len, tb.MAX_BRANCH_SPLITS)):
        if total == 0:
            assert splits == 0
            continue
        assert 1 <= splits <= cap and length % tb.BLOCK_N == 0
        assert (splits - 1) * length < total <= splits * length  # no empty split, none missing


@needs_triton
@pytest.mark.skipif(INTERPRET, reason="kernels are interpreted functions under TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("window", [False, True])
def test_kernels_compile_for_sm90(dtype: str, window: bool) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    def build(fn, types: dict[str, str], consts: dict[str, object], stages: int) -> None:  # type: ignore[no-untyped-def]
        names = fn.arg_names
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()})
        kernel = compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": stages})
        assert kernel.metadata.shared <= 100 * 1024  # fits an sm_80/sm_90 block with room

    ptrs = {"Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}", "Lens": "*i64", "OP": "*fp32", "LSEP": "*fp32",
            "sm_scale": "fp32"}
    block_n = tb.BLOCK_N_FP32 if dtype == "fp32" else tb.BLOCK_N
    stages = 2 if dtype == "fp32" else 3
    for fn, block_m in ((tb._prefix_kernel, 64), (tb._branch_kernel, 16)):
        consts = {"HAS_WINDOW": window, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": 128, "PRECISION": "ieee"}
        build(fn, ptrs, consts, stages)
    build(tb._combine_kernel, {"OP": "*fp32", "LSEP": "*fp32", "Out": f"*{dtype}"}, {"BLOCK_S": 32, "BLOCK_D": 128}, 1)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", [*CASES, "multi_split"])
def test_interpreted_kernels_match_reference(name: str, dtype: torch.dtype) -> None:
    k, h, hkv, t, d, p, s, lengths, window = MULTI_SPLIT if name == "multi_split" else CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, dtype, seed=len(name), junk=3.0)
    _check(case, dtype, "cpu", sm_count=8, window=window)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", [*CASES, "multi_split"])
def test_gpu_kernels_match_reference(name: str, dtype: torch.dtype) -> None:
    k, h, hkv, t, d, p, s, lengths, window = MULTI_SPLIT if name == "multi_split" else CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, dtype, seed=len(name), junk=3.0)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    _check(case, dtype, "cuda", sm_count=sm_count, window=window)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gpu_dispatch_uses_kernel_on_7b_shape(dtype: torch.dtype) -> None:
    case = [t.cuda() for t in make_case(16, 32, 32, 1, 128, 2048, 64, [64 - b for b in range(16)], dtype)]
    out = bifurcated_attention(*case)
    torch.testing.assert_close(out, tb.triton_bifurcated_attention(*case), atol=0, rtol=0)
    want = reference_bifurcated_attention(*case)
    torch.testing.assert_close(out.float(), want.float(), **KERNEL_TOL[dtype])
