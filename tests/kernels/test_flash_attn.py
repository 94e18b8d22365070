"""flash-attn as an attention path (kernels/flash_bifurcated.py), the log-sum-exp merge
(kernels/lse_merge.py) and the choice of path (kernels/paths.py).

Where each group runs:
  * always (CPU): the merge with the reference's own two halves; the glue against a CPU
    stand-in for flash-attn (flash_attn_standin.py: the documented semantics, float64);
    the path rule; the path in the engine's status;
  * CUDA + flash-attn installed: the real kernels against the reference (bf16, fp16), on the
    dispatcher and on the prefill path.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F

import flash_attn_standin
from attention_cases import CASES, make_case
from kspec.kernels import flash_bifurcated as fb
from kspec.kernels.contract import check_inputs, lengths_list
from kspec.kernels.lse_merge import clean_lse, merge_by_lse
from kspec.kernels.paths import Installed, attention_paths, bifurcated_path, prefill_path
from kspec.kernels.reference import _branch_piece, _prefix_piece, reference_bifurcated_attention

HAS_FLASH = torch.cuda.is_available() and fb.load() is not None
needs_flash = pytest.mark.skipif(not HAS_FLASH, reason="needs a CUDA GPU and flash-attn >= 2.6 (pip install flash-attn --no-build-isolation)")
GPU_TOL = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def _window_fits(case: tuple) -> bool:
    """The flash path's own limit: a window may not hide prefix keys."""
    _, _, _, _, _, prefix, _, lengths, window = case
    return window is None or prefix == 0 or prefix + max(lengths) <= window


def _as_out_lse(piece: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference piece (acc, row max, row sum) [k, Hkv, g, T, ...] -> (out, lse) [k, H, T, ...]."""
    k, heads, new, dim = like.shape
    if piece is None:
        return torch.zeros(k, heads, new, dim, dtype=torch.float64), torch.full((k, heads, new), -math.inf, dtype=torch.float64)
    acc, m, l = piece
    seen = l > 0
    out = acc / torch.where(seen, l, 1.0).unsqueeze(-1)  # [k, Hkv, g, T, D]
    lse = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), -math.inf)  # [k, Hkv, g, T]
    return out.reshape(k, heads, new, dim), lse.reshape(k, heads, new)


# -- the merge, with the reference's halves ---------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_merge_of_the_reference_halves_is_the_reference(name: str) -> None:
    k, h, hkv, t, d, p, s, lengths, window = CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, torch.float64, junk=1e3)
    q, pk, pv, bk, bv, lens = case
    dims = check_inputs(*case, sliding_window=window)
    host = lengths_list(lens, dims.capacity)
    qs = q / math.sqrt(d)  # [k, H, T, D], scaled as the reference scales
    prefix = _prefix_piece(qs, pk, pv, host, dims, window) if p > 0 else None
    branch = _branch_piece(qs, bk, bv, host, dims, window)
    out_p, lse_p = _as_out_lse(prefix, q)
    out_b, lse_b = _as_out_lse(branch, q)
    merged = merge_by_lse(out_p, lse_p, out_b, lse_b, torch.float64)  # [k, H, T, D]
    want = reference_bifurcated_attention(*case, sliding_window=window)
    assert torch.isfinite(merged).all()
    torch.testing.assert_close(merged, want, atol=1e-10, rtol=1e-10)


def test_merge_treats_flash_attn_empty_rows_as_no_keys() -> None:
    out_a, out_b = torch.randn(3, 4), torch.randn(3, 4)
    lse_a = torch.tensor([math.inf, 0.5, math.inf])  # flash-attn 2: +inf = the row saw no key
    lse_b = torch.tensor([1.0, -math.inf, math.inf])
    merged = merge_by_lse(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(merged[0], out_b[0])  # only b saw keys
    torch.testing.assert_close(merged[1], out_a[1])  # only a saw keys
    assert torch.equal(merged[2], torch.zeros(4))  # neither: 0, finite
    assert clean_lse(torch.tensor([math.inf, math.nan, 2.0])).tolist() == [-math.inf, -math.inf, 2.0]


def test_merge_weights_by_log_sum_exp() -> None:
    """Two halves over disjoint keys of one softmax: the merge is the softmax over all of them."""
    scores, values = torch.randn(5, 9, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
    halves = [(torch.softmax(scores[:, cols], -1) @ values[cols], torch.logsumexp(scores[:, cols], -1)) for cols in (slice(0, 4), slice(4, 9))]
    merged = merge_by_lse(*halves[0], *halves[1])
    torch.testing.assert_close(merged, torch.softmax(scores, -1) @ values)


# -- the glue, against the CPU stand-in --------------------------------------------------


def test_the_stand_in_has_the_api_and_the_module_loads_lazily() -> None:
    assert fb.has_api(flash_attn_standin)
    assert fb.load() is None or torch.cuda.is_available()  # flash-attn cannot import without CUDA


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if _window_fits(c)])
def test_flash_glue_with_the_stand_in_equals_the_reference(name: str, dtype: torch.dtype) -> None:
    k, h, hkv, t, d, p, s, lengths, window = CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, dtype, junk=1e3)
    out = fb.flash_bifurcated_attention(*case, None, window, flash_attn_standin)  # [k, H, T, D]
    want = reference_bifurcated_attention(*case, sliding_window=window)
    assert out.dtype == dtype and out.shape == want.shape and torch.isfinite(out).all()
    ok = (case[5][:, None] - t + torch.arange(t)) >= 0  # [k, T]: rows with a position of their own
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    mask = ok[:, None, :, None].expand_as(want)
    torch.testing.assert_close(out.float()[mask], want.float()[mask], **tol)


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("window", [None, 3])
def test_flash_cache_attention_with_the_stand_in_equals_sdpa(ragged: bool, window: int | None) -> None:
    """The prefill path: T new tokens per row over a cache, rows at equal or ragged lengths."""
    g = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, new, dim, capacity = 3, 6, 2, 4, 16, 20
    starts = [5, 0, 9] if ragged else [7, 7, 7]
    q = torch.randn(batch, heads, new, dim, generator=g)  # [B, H, T, D]
    keys, values = (torch.randn(batch, kv_heads, capacity, dim, generator=g) for _ in range(2))  # [B, Hkv, C, D]
    ends = torch.tensor(starts) + new  # [B]
    kv_len = int(ends.max())
    out = fb.flash_cache_attention(q, keys, values, kv_len, ends if ragged else None, None, window, flash_attn_standin)
    positions = torch.tensor(starts)[:, None] + torch.arange(new)  # [B, T]
    j = torch.arange(kv_len)
    visible = j[None, None] <= positions[..., None]  # [B, T, kv_len]
    if window is not None:
        visible &= positions[..., None] - j < window
    want = F.scaled_dot_product_attention(q, keys[:, :, :kv_len], values[:, :, :kv_len], attn_mask=visible[:, None], enable_gqa=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)


def test_supports_says_where_the_path_is_exact() -> None:
    q = torch.zeros(2, 4, 1, 64, dtype=torch.bfloat16)
    assert not fb.supports(q, 10, [3, 4], None)  # CPU tensors: never
    assert not fb.supports_prefill(q)
    if torch.cuda.is_available():
        cq = q.cuda()
        assert fb.supports(cq, 10, [3, 4], None)
        assert fb.supports(cq, 10, [3, 4], 14) and not fb.supports(cq, 10, [3, 5], 14)  # the window reaches into the prefix
        assert not fb.supports(cq, 10, None, 14)  # unknown lengths: assume it does
        assert fb.supports(cq, 0, None, 2)  # no prefix: nothing for a window to hide there
        assert not fb.supports(cq.float(), 10, [3, 4], None)  # fp32: not FlashAttention 2
        assert not fb.supports(torch.zeros(2, 4, 1, 20, dtype=torch.bfloat16, device="cuda"), 10, [3, 4], None)


# -- which path runs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "device, dtype, head_dim, installed, decode, prefill",
    [
        ("cuda", torch.bfloat16, 128, Installed(flash_attn=True, triton=True), "flash-attn", "flash-attn"),
        ("cuda", torch.float16, 64, Installed(flash_attn=True, triton=False), "flash-attn", "flash-attn"),
        ("cuda", torch.float32, 128, Installed(flash_attn=True, triton=True), "triton", "sdpa"),  # FA2 has no fp32
        ("cuda", torch.bfloat16, 80, Installed(flash_attn=True, triton=True), "flash-attn", "flash-attn"),
        ("cuda", torch.bfloat16, 20, Installed(flash_attn=True, triton=True), "triton", "sdpa"),  # head dim not a multiple of 8
        ("cuda", torch.bfloat16, 128, Installed(flash_attn=False, triton=True), "triton", "sdpa"),
        ("cuda", torch.bfloat16, 128, Installed(flash_attn=False, triton=False), "pytorch", "sdpa"),
        ("cuda", torch.float64, 128, Installed(flash_attn=True, triton=True), "pytorch", "sdpa"),
        ("cpu", torch.float32, 64, Installed(flash_attn=True, triton=True), "cpu-fused", "sdpa"),
        ("cpu", torch.bfloat16, 64, Installed(cpu_fused=False), "pytorch", "sdpa"),
        ("cpu", torch.float64, 64, Installed(), "pytorch", "sdpa"),
    ],
)
def test_path_rule(device: str, dtype: torch.dtype, head_dim: int, installed: Installed, decode: str, prefill: str) -> None:
    assert bifurcated_path(device, dtype, head_dim, installed) == decode
    assert prefill_path(device, dtype, head_dim, installed) == prefill
    assert attention_paths(device, dtype, head_dim, installed) == {"prefill": prefill, "decode": decode}


def test_this_machine_paths_are_detected() -> None:
    found = Installed.detect()
    assert found.flash_attn == (fb.load() is not None)
    if not torch.cuda.is_available():
        assert attention_paths("cpu", torch.float32, 64) == {"prefill": "sdpa", "decode": "cpu-fused" if found.cpu_fused else "pytorch"}


def test_status_carries_the_attention_paths() -> None:
    from kspec.engine.serve.status import READY, Status
    from kspec.engine.serve.wire import decode, encode
    from kspec.lsp_server.status_report import status_for_editor

    paths = {"prefill": "flash-attn", "decode": "flash-attn"}
    status = Status(READY, "ready", model="m", attention=paths)
    assert status_for_editor(status)["attention"] == paths  # what $/kspec/status sends
    assert decode(encode(status)) == status  # through the daemon's wire
    assert "attention" not in status_for_editor(Status(READY))


# -- the real kernels (CUDA + flash-attn) ---------------------------------------------------


@needs_flash
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if _window_fits(c) and c[4] % 8 == 0])
def test_flash_attn_on_gpu_equals_the_reference(name: str, dtype: torch.dtype) -> None:
    from kspec.kernels.bifurcated import bifurcated_attention

    k, h, hkv, t, d, p, s, lengths, window = CASES[name]
    case = make_case(k, h, hkv, t, d, p, s, lengths, dtype)
    want = reference_bifurcated_attention(*case, sliding_window=window).float()
    ok = ((case[5][:, None] - t + torch.arange(t)) >= 0)[:, None, :, None].expand_as(want)  # rows with own keys
    gpu = [x.cuda() for x in case]
    for out in (fb.flash_bifurcated_attention(*gpu, None, window, fb.load()), bifurcated_attention(*gpu, sliding_window=window)):
        out = out.float().cpu()
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[ok], want[ok], **GPU_TOL[dtype])


@needs_flash
@pytest.mark.parametrize("ragged", [False, True])
def test_flash_prefill_on_gpu_equals_sdpa(ragged: bool) -> None:
    from kspec.engine.cache.kv import CacheShape, RaggedKVCache

    shape = CacheShape(1, 4, 64)
    cache = RaggedKVCache(shape, 3, 64, torch.bfloat16, "cuda")
    cache.lengths = [5, 0, 9] if ragged else [7, 7, 7]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(3, 8, 6, 64, generator=g, device="cuda").bfloat16()  # [B, H, T, D]
    k, v = (torch.randn(3, 4, 6, 64, generator=g, device="cuda").bfloat16() for _ in range(2))  # [B, Hkv, T, D]
    step = cache.prepare(6)
    out = cache.attend(0, q, k, v, step)  # flash-attn on this path
    want = F.scaled_dot_product_attention(q, cache.keys[0][:, :, : step.kv_len], cache.values[0][:, :, : step.kv_len],
                                          attn_mask=step.mask, is_causal=step.is_causal, enable_gqa=True)  # fmt: skip
    torch.testing.assert_close(out.float(), want.float(), **GPU_TOL[torch.bfloat16])


@pytest.mark.parametrize("starts, new, window", [([0, 0], 6, None), ([7, 7], 3, None), ([5, 0, 9], 4, None), ([5, 0, 9], 4, 3), ([9, 9], 1, 4)])
def test_the_cache_takes_the_flash_path_with_its_own_row_ends(monkeypatch, starts: list[int], new: int, window: int | None) -> None:
    """RaggedKVCache.attend routed through the flash path (the stand-in, on CPU) equals its SDPA
    path: uniform rows (a prefill, a chunk after a prefix, a decode step) and ragged ones."""
    from kspec.engine.cache.kv import CacheShape, RaggedKVCache

    g = torch.Generator().manual_seed(2)
    q = torch.randn(len(starts), 6, new, 16, generator=g)  # [B, H, T, D]
    k, v = (torch.randn(len(starts), 2, new, 16, generator=g) for _ in range(2))  # [B, Hkv, T, D]
    history = torch.randn(2, len(starts), 2, 24, 16, generator=g)  # what the rows already hold

    def attend() -> torch.Tensor:
        cache = RaggedKVCache(CacheShape(1, 2, 16, window), len(starts), 24, torch.float32)
        cache.keys[0], cache.values[0] = history[0], history[1]
        cache.lengths = list(starts)
        return cache.attend(0, q, k, v, cache.prepare(new))

    want = attend()  # SDPA
    calls: list[str] = []
    counted = types.SimpleNamespace(**{
        name: (lambda fn, name: lambda *a, **kw: calls.append(name) or fn(*a, **kw))(getattr(flash_attn_standin, name), name)
        for name in ("flash_attn_func", "flash_attn_with_kvcache")
    })  # fmt: skip
    monkeypatch.setattr(fb, "load", lambda: counted)
    monkeypatch.setattr(fb, "supports_prefill", lambda q: True)
    torch.testing.assert_close(attend(), want, atol=1e-5, rtol=1e-4)
    assert calls == ["flash_attn_with_kvcache" if len(set(starts)) > 1 else "flash_attn_func"]
