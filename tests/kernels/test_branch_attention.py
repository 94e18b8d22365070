"""The layer loop's attention (kernels/csrc/branch_layers.cpp, op ``kspec::branch_attention``)
against the contract's reference (kernels/reference.py) in float32: written out on an AVX-512 or AVX2
build for heads of 64 and 128 (one query at a time below three quarters of a register's lanes
of queries per kv head, a kv head's queries in a register's lanes from there), PyTorch's flash kernel and a merge elsewhere. Every
way is the same softmax over the same scores: 1e-5 of the output's scale. A prefix stored in
float16 (the prompt's KV on the CPU fast path) is read as its float32 values."""

from __future__ import annotations

import pytest
import torch

from kspec.engine.models.resolve import cache_root
from kspec.kernels import cpu_layers
from kspec.kernels.contract import BranchLayout
from kspec.kernels.reference import reference_bifurcated_attention

attention = cpu_layers.load_attention(cache_root())
pytestmark = pytest.mark.skipif(attention is None, reason=cpu_layers.unavailable_reason(cache_root()) or "not built")

CASES = {  # heads, kv heads, head size, prefix, entries before the step per branch, new tokens T
    "k1-decode": (9, 3, 64, 512, [16], 1),
    "k2-ragged": (9, 3, 64, 100, [5, 2], 1),
    "k4-decode-lanes": (9, 3, 64, 300, [7, 7, 7, 7], 1),
    "k8-verify-tiles": (9, 3, 64, 257, [3, 9, 0, 4, 11, 1, 6, 2], 5),
    "no-prefix": (4, 2, 64, 0, [0, 3, 1], 2),
    "head-128": (4, 1, 128, 70, [2, 6, 4], 3),
    "head-128-one-row": (4, 4, 128, 33, [5], 1),
    "head-16-flash": (4, 2, 16, 40, [3, 1], 2),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_the_loops_attention_is_the_reference(case: str) -> None:
    _check(case)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("case", ["k1-decode", "k4-decode-lanes"])
def test_a_prefix_cut_into_pieces_for_the_threads_is_the_same_softmax(case: str, threads: int) -> None:
    """Where kv heads x query tiles do not split evenly between the threads (3 kv heads, 2 or 4
    threads), the prefix is cut into 2-4 pieces whose outputs are joined by their maxima and sums."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(case)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("case", ["k8-verify-tiles", "no-prefix", "head-128", "head-16-flash"])
def test_a_verifications_rows_without_their_padding_are_the_same_rows(case: str) -> None:
    """padded_rows: each branch's first few new tokens only (drafts shorter than the longest), the
    padding neither computed nor attended to; each computed row equals the reference's row."""
    new = CASES[case][-1]
    counts = [1 + (b * 3) % new for b in range(len(CASES[case][4]))]  # 1..T rows per branch
    _check(case, [b * new + t for b, count in enumerate(counts) for t in range(count)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_float16_prefix_is_read_as_its_float32_values(case: str, threads: int) -> None:
    """The prefix in float16 (converted a chunk of rows at a time where written out, whole for
    PyTorch's flash kernel): the same output as the reference over those values in float32,
    prefix cut into pieces (2 threads) or not."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check(case, prefix_dtype=torch.float16)
    finally:
        torch.set_num_threads(before)


LONG_CASES = {  # thousands of prefix keys: many chunks of converted rows
    "long-k1": (9, 3, 64, 1500, [4], 1),  # one query at a time
    "long-verify": (9, 3, 64, 1500, [3, 9, 0, 4, 11, 1, 6, 2], 5),  # wide tiles
    "long-head-128": (4, 1, 128, 1100, [2, 6, 4], 3),
}


@pytest.mark.parametrize("case", list(LONG_CASES), ids=list(LONG_CASES))
def test_a_float16_prefix_longer_than_a_conversion_chunk(case: str) -> None:
    _check(case, prefix_dtype=torch.float16)


def _check(case: str, padded_rows: list[int] | None = None, prefix_dtype: torch.dtype = torch.float32) -> None:
    heads, kv_heads, dim, prefix, before, new = CASES[case] if case in CASES else LONG_CASES[case]
    generator = torch.Generator().manual_seed(len(case))
    k, capacity = len(before), max(before) + new + 5
    q = torch.randn(k, heads, new, dim, generator=generator)  # [k, H, T, D]
    # the prefix as a view into cache buffers longer than it (a head's keys not adjacent to the next head's)
    prefix_k, prefix_v = (torch.randn(1, kv_heads, prefix + 7, dim, generator=generator).to(prefix_dtype)[:, :, :prefix] for _ in range(2))
    branch_k = torch.randn(k, kv_heads, capacity, dim, generator=generator)  # [k, Hkv, S, D]
    branch_v = torch.randn(k, kv_heads, capacity, dim, generator=generator)
    after = [n + new for n in before]
    layout = BranchLayout.build(after, new, torch.float32, "cpu")
    # the reference in float64: the exact softmax, not another float32 summation order (BLAS's varies with its threads)
    exact = (t.double() for t in (q, prefix_k, prefix_v, branch_k, branch_v))
    want = reference_bifurcated_attention(*exact, torch.tensor(after)).float()  # type: ignore[call-arg]  # [k, H, T, D]
    queries = q.transpose(1, 2).reshape(k * new, heads, dim)  # [R, H, D]: row b T + t
    want_rows = want.transpose(1, 2).reshape(k * new, heads * dim)
    if padded_rows is not None:
        assert len(padded_rows) < k * new, "the case must leave some padding out"
        queries, want_rows = queries[padded_rows], want_rows[padded_rows]
    got = attention(queries, prefix_k, prefix_v, branch_k, branch_v, layout.branch_mask, before, padded_rows or [], new)  # [R, H * D]
    torch.testing.assert_close(got, want_rows, atol=1e-5 * float(want_rows.abs().max()), rtol=0)
