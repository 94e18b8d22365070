"""Reference bifurcated attention against a float64 per-query oracle on replicated KV.

Tolerances (output vs float64 oracle run on the same, already rounded inputs):
  fp32: atol 1e-5, rtol 1e-4
  bf16: atol 1e-2, rtol 1.6e-2 (scores/softmax in fp32; only the output is rounded)
  fp16: atol 2e-3, rtol 2e-3
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_cases import CASES, TOL, assert_close, make_case, valid_rows
from kspec.bench.attention import bench_attention
from attention_oracle import naive_attention
from kspec.bench.baselines import dense_attention, replicated_attention
from kspec.kernels import cpu_fused
from kspec.kernels.bifurcated import bifurcated_attention
from kspec.kernels.contract import BranchLayout
from kspec.kernels.reference import reference_bifurcated_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_naive(name: str, dtype: torch.dtype) -> None:
    k, h, hkv, t, d, p, s, lengths, window = CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, dtype, seed=len(name), junk=3.0)
    out = bifurcated_attention(*case, sliding_window=window)
    assert out.shape == (k, h, t, d) and out.dtype == dtype
    # The oracle shares the documented don't-care semantics (prefix only, or 0), so every
    # row is compared, including rows of branches shorter than T.
    assert_close(out, naive_attention(*case, sliding_window=window), dtype)


@pytest.mark.parametrize("name", list(CASES))
def test_replicated_baseline_agrees_on_valid_rows(name: str) -> None:
    k, h, hkv, t, d, p, s, lengths, window = CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, seed=1)
    ok = valid_rows(case[5], h, t)
    rep = replicated_attention(*case, sliding_window=window)
    assert torch.isfinite(rep).all()
    want = naive_attention(*case, sliding_window=window)
    torch.testing.assert_close(rep.double()[ok], want[ok], **TOL[torch.float32])


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 5),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    new=st.integers(1, 5),
    dim=st.sampled_from([4, 8, 16, 24]),
    prefix=st.integers(0, 40),
    capacity=st.integers(0, 20),
    window=st.one_of(st.none(), st.integers(1, 50)),
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
    data=st.data(),
)
def test_random_shapes_fp32(
    k: int, kv_heads: int, group: int, new: int, dim: int, prefix: int, capacity: int,
    window: int | None, scale: float | None, data: st.DataObject,
) -> None:
    lengths = data.draw(st.lists(st.integers(0, capacity), min_size=k, max_size=k))
    case = make_case(k, kv_heads * group, kv_heads, new, dim, prefix, capacity, lengths, junk=5.0)
    out = bifurcated_attention(*case, scale=scale, sliding_window=window)
    assert_close(out, naive_attention(*case, scale=scale, sliding_window=window), torch.float32)


def test_unused_capacity_never_leaks() -> None:
    """Entries at or beyond a branch's length get no weight: changing them changes nothing."""
    a = make_case(3, 6, 2, 2, 16, 10, 12, [12, 4, 2], junk=0.0)
    b = make_case(3, 6, 2, 2, 16, 10, 12, [12, 4, 2], junk=1e4)
    torch.testing.assert_close(bifurcated_attention(*a), bifurcated_attention(*b), atol=0, rtol=0)


def test_default_scale_is_inverse_sqrt_dim() -> None:
    case = make_case(2, 4, 2, 2, 16, 7, 5, [5, 3])
    torch.testing.assert_close(bifurcated_attention(*case), bifurcated_attention(*case, scale=0.25))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bifurcated_attention(*case), bifurcated_attention(*case, scale=0.5))


def test_dense_attention_is_the_p0_case() -> None:
    q, pk, pv, bk, bv, lengths = make_case(3, 6, 3, 2, 16, 0, 9, [9, 5, 2])
    torch.testing.assert_close(dense_attention(q, bk, bv, lengths), bifurcated_attention(q, pk, pv, bk, bv, lengths))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_dispatch_is_the_fused_kernel_where_it_applies(dtype: torch.dtype) -> None:
    """On CPU the flash-kernel path serves every case it computes exactly (the engine's: each
    branch holds its T new entries, no window hiding prefix keys) and agrees with the reference."""
    case = make_case(3, 6, 3, 2, 16, 21, 9, [9, 5, 2], dtype)
    layout = BranchLayout.build([9, 5, 2], 2, dtype, "cpu")
    assert cpu_fused.supports(case[0], 21, layout, None)
    fused = cpu_fused.fused_bifurcated_attention(*case[:5], layout)
    torch.testing.assert_close(bifurcated_attention(*case), fused, atol=0, rtol=0)
    assert_close(fused, naive_attention(*case), dtype)
    short = BranchLayout.build([9, 1, 2], 2, dtype, "cpu")  # a branch with fewer entries than new tokens
    assert not cpu_fused.supports(case[0], 21, short, None)
    assert not cpu_fused.supports(case[0], 21, layout, 16)  # the window hides prefix keys


def test_a_layout_gives_the_same_result_as_lengths() -> None:
    """A BranchLayout (built once per forward pass: host lengths, mask) changes nothing."""
    for window in (None, 6):
        case = make_case(3, 6, 3, 2, 16, 21, 9, [9, 5, 2], junk=3.0)
        layout = BranchLayout.build([9, 5, 2], 2, torch.float32, "cpu", window)
        for attention in (bifurcated_attention, reference_bifurcated_attention):
            torch.testing.assert_close(
                attention(*case[:5], layout, sliding_window=window), attention(*case, sliding_window=window), atol=0, rtol=0
            )


def test_non_contiguous_inputs() -> None:
    q, pk, pv, bk, bv, lengths = make_case(3, 6, 3, 2, 16, 21, 9, [9, 5, 2])
    q_nc = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, [k, H, T, D] with T-major strides
    bk_nc = bk.transpose(2, 3).contiguous().transpose(2, 3)
    assert not q_nc.is_contiguous() and not bk_nc.is_contiguous()
    torch.testing.assert_close(
        bifurcated_attention(q_nc, pk, pv, bk_nc, bv, lengths), bifurcated_attention(q, pk, pv, bk, bv, lengths)
    )


def test_sliding_window_changes_result() -> None:
    """Guards against a window that is silently ignored."""
    case = make_case(2, 4, 2, 2, 16, 30, 8, [8, 5])
    full = bifurcated_attention(*case)
    windowed = bifurcated_attention(*case, sliding_window=4)
    assert (full - windowed).abs().max() > 1e-3
    torch.testing.assert_close(bifurcated_attention(*case, sliding_window=10_000), full)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: (c[0][:, :5], *c[1:]), "multiple of Hkv"),
        (lambda c: (*c[:5], torch.tensor([9, 1])), r"\[0, S=8\]"),
        (lambda c: (*c[:5], torch.tensor([1.0, 2.0])), "integer tensor"),
        (lambda c: (c[0].double(), *c[1:]), "dtype"),
        (lambda c: (c[0][0], *c[1:]), r"\[k, H, T, D\]"),
        (lambda c: (c[0], c[1], c[2][:, :, :3], *c[3:]), "differ"),
        (lambda c: (c[0], c[1], c[2], c[3][:1], *c[4:]), "branch_k"),
    ],
)
def test_bad_inputs_raise_value_error(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    case = make_case(2, 6, 2, 1, 8, 4, 8, [8, 3])
    with pytest.raises(ValueError, match=message):
        bifurcated_attention(*mutate(case))


def test_bad_window_raises() -> None:
    with pytest.raises(ValueError, match="sliding_window"):
        bifurcated_attention(*make_case(2, 2, 1, 1, 8, 4, 4, [4, 1]), sliding_window=0)


def test_bench_attention_report_shape() -> None:
    report = bench_attention(ks=[2, 3], contexts=[64], repeats=2, heads=4, kv_heads=2, head_dim=16, branch_tokens=8)
    json.dumps(report)
    cases = report["cases"]
    assert [(c["k"], c["context"]) for c in cases] == [(2, 64), (3, 64)]
    for c in cases:
        assert set(c) == {"k", "context", "replicated_ms", "bifurcated_ms", "ratio"}
        assert c["replicated_ms"] > 0 and c["bifurcated_ms"] > 0
        assert math.isclose(c["ratio"], c["replicated_ms"] / c["bifurcated_ms"], rel_tol=1e-2)
