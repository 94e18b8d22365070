"""KV caches the decoder writes into and attends over.

The model talks to a cache through three calls per forward pass:
`prepare(T)` (positions and masks for T new tokens per row, computed once for all
layers), `attend(layer, q, k, v, step)` (write the new K/V by index, attend over the
row's whole history) and, after the pass, `advance(n)` (how many of the T new tokens
each row keeps; the rest is rolled back by simply not counting it).

`RaggedKVCache` is the plain cache: one preallocated buffer per row, rows may have
different lengths (a batch of prompts of different lengths, or branches that accepted
different numbers of draft tokens).

A cache may store its KV in another dtype than the model computes in (the CPU fast path keeps a
prompt's KV in float16: a decode step reads half the bytes of it); PyTorch's attention then
reads it converted to the queries' dtype, the C++ layer loop reads float16 itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from kspec.engine.errors import InputError
from kspec.kernels import flash_bifurcated  # imports cleanly without flash-attn or CUDA
from kspec.kernels.contract import BranchLayout
from kspec.kernels.transfer import to_device


@dataclass(frozen=True)
class StepContext:
    """What one forward pass of T new tokens per row needs, shared by every layer."""

    positions: Tensor  # [B, T] absolute positions of the new tokens (rotary + masks)
    n_new: int  # T


_StepT = TypeVar("_StepT", bound=StepContext)


class KVCache(Protocol):
    def prepare(self, n_new: int) -> StepContext: ...

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, step: StepContext) -> Tensor: ...

    def advance(self, n_kept: int | Sequence[int]) -> None: ...


def as_dtype(stored: Tensor, dtype: torch.dtype) -> Tensor:
    """Stored KV as the attention computes it: itself, or a converted copy (a float16 prompt KV
    read by PyTorch's attention in float32)."""
    return stored if stored.dtype == dtype else stored.to(dtype)


def _expect(step: StepContext, kind: type[_StepT]) -> _StepT:
    if not isinstance(step, kind):
        raise TypeError(f"{type(step).__name__} was prepared by another cache (expected {kind.__name__})")
    return step


@dataclass(frozen=True)
class CacheShape:
    n_layers: int
    n_kv_heads: int
    head_dim: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class _RaggedStep(StepContext):
    kv_len: int = 0  # keys attended: [0, kv_len)
    uniform_start: int | None = None  # all rows start at this length (slice writes), else None
    mask: Tensor | None = None  # [B or 1, 1, T, kv_len] bool, True = attend; None = everything visible
    is_causal: bool = False


class RowLengths:
    """Per-row lengths of a cache: what `advance` keeps and `truncate` rolls back.
    Rolling back is only a shorter length; the buffers are overwritten later."""

    lengths: list[int]

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def advance(self, n_kept: int | Sequence[int]) -> None:
        kept = [n_kept] * self.batch if isinstance(n_kept, int) else list(n_kept)
        if len(kept) != self.batch:
            raise ValueError(f"advance: got {len(kept)} counts for {self.batch} rows")
        self.lengths = [length + n for length, n in zip(self.lengths, kept)]

    def truncate(self, row: int, length: int) -> None:
        """Roll a row back to its first `length` entries (e.g. rejected drafts)."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"truncate row {row} to {length}: it holds {self.lengths[row]}")
        self.lengths[row] = length


class RaggedKVCache(RowLengths):
    """K/V buffers [layers, B, Hkv, capacity, D] with one length per row, written by index.

    zero=False leaves the buffers uninitialized, for a cache whose slots are all written before
    anything reads them (a prompt's prefill, capacity its length: a row shorter than the batch's
    longest would have unwritten slots read, masked, by the attention). A 1k-token prompt's
    zeroed buffers cost a fresh page per 4 KB of 47 MB.

    dtype: what the buffers store; compute_dtype: the model's (default: dtype), that of the
    branch buffers over this prompt (`BranchKVCache.from_prompt`)."""

    def __init__(
        self, shape: CacheShape, batch: int, capacity: int, dtype: torch.dtype, device: torch.device | str = "cpu",
        zero: bool = True, compute_dtype: torch.dtype | None = None,
    ):  # fmt: skip
        if batch <= 0 or capacity <= 0:
            raise ValueError(f"batch and capacity must be > 0, got {batch}, {capacity}")
        self.shape = shape
        self.capacity = capacity
        buffer_shape = (shape.n_layers, batch, shape.n_kv_heads, capacity, shape.head_dim)
        allocate = torch.zeros if zero else torch.empty
        self.keys = allocate(buffer_shape, dtype=dtype, device=device)  # [L, B, Hkv, C, D]
        self.values = allocate(buffer_shape, dtype=dtype, device=device)  # [L, B, Hkv, C, D]
        self.compute_dtype = compute_dtype or dtype
        self.lengths: list[int] = [0] * batch

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    def prepare(self, n_new: int) -> StepContext:
        device = self.keys.device
        start = max(self.lengths)
        kv_len = start + n_new
        if kv_len > self.capacity:
            raise InputError(f"context of {kv_len} tokens exceeds the cache capacity of {self.capacity}")
        offsets = torch.arange(n_new, device=device)  # [T]
        if all(length == start for length in self.lengths):
            positions = (start + offsets).expand(self.batch, n_new)  # [B, T]
            mask, is_causal = self._uniform_mask(start, n_new, device)
            return _RaggedStep(positions, n_new, kv_len, start, mask, is_causal)
        lengths = to_device(self.lengths, torch.int64, device)  # [B]
        positions = lengths[:, None] + offsets  # [B, T]
        key_positions = torch.arange(kv_len, device=device)  # [S]
        mask = key_positions[None, None, :] <= positions[:, :, None]  # [B, T, S]
        mask = self._apply_window(mask, positions, key_positions)
        return _RaggedStep(positions, n_new, kv_len, None, mask[:, None], False)

    def _uniform_mask(self, start: int, n_new: int, device: torch.device) -> tuple[Tensor | None, bool]:
        window = self.shape.sliding_window
        windowed = window is not None and start + n_new > window
        if n_new == 1 and not windowed:
            return None, False
        if start == 0 and not windowed:
            return None, True
        positions = start + torch.arange(n_new, device=device)  # [T]
        key_positions = torch.arange(start + n_new, device=device)  # [S]
        mask = key_positions[None, :] <= positions[:, None]  # [T, S]
        mask = self._apply_window(mask, positions, key_positions)
        return mask[None, None], False

    def _apply_window(self, mask: Tensor, positions: Tensor, key_positions: Tensor) -> Tensor:
        window = self.shape.sliding_window
        if window is None:
            return mask
        return mask & (positions[..., :, None] - key_positions < window)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, step: StepContext) -> Tensor:
        """q [B, H, T, D], k/v [B, Hkv, T, D] -> [B, H, T, D]."""
        step = _expect(step, _RaggedStep)
        keys, values = self.keys[layer], self.values[layer]  # [B, Hkv, C, D]
        if step.uniform_start is not None:
            stop = step.uniform_start + step.n_new
            keys[:, :, step.uniform_start : stop] = k
            values[:, :, step.uniform_start : stop] = v
        else:
            rows = torch.arange(self.batch, device=q.device)[:, None]  # [B, 1]
            keys[rows, :, step.positions] = k.transpose(1, 2)  # [B, T, Hkv, D] by index
            values[rows, :, step.positions] = v.transpose(1, 2)
        fa = flash_bifurcated.load() if flash_bifurcated.supports_prefill(q) else None
        if fa is not None:  # CUDA with flash-attn (kernels/paths.py: prefill_path)
            row_ends = None if step.uniform_start is not None else step.positions[:, -1] + 1  # [B]
            return flash_bifurcated.flash_cache_attention(
                q, keys, values, step.kv_len, row_ends, None, self.shape.sliding_window, fa
            )
        return F.scaled_dot_product_attention(
            q,
            as_dtype(keys[:, :, : step.kv_len], q.dtype),
            as_dtype(values[:, :, : step.kv_len], q.dtype),
            attn_mask=step.mask,
            is_causal=step.is_causal,
            enable_gqa=q.shape[1] != k.shape[1],
        )



@dataclass(frozen=True)
class _BranchStep(StepContext):
    write_positions: Tensor = None  # type: ignore[assignment]  # [k, T] slots in each branch buffer
    layout: BranchLayout = None  # type: ignore[assignment]  # branch entries incl. the T new ones, mask: once for all layers
    rows: Tensor = None  # type: ignore[assignment]  # [k, 1] branch index for the ragged writes
    uniform_start: int | None = None  # every branch writes at this slot (one slice copy), else None


class BranchKVCache(RowLengths):
    """k branches over one shared prompt: the prompt's KV is stored once (batch 1), each
    branch owns only the KV of the tokens it generated, preallocated and written by index.
    Attention is bifurcated (kernels/reference.py, dispatched by kernels/bifurcated.py): one matmul over the prefix for all
    branches, one per branch over its own entries, merged with log-sum-exp.

    prefix_keys/values [L, 1, Hkv, P, D]; branch buffers [L, k, Hkv, capacity, D] in `dtype`
    (default: the prefix's; a float16 prefix has float32 branches on the CPU fast path).
    """

    def __init__(
        self,
        shape: CacheShape,
        prefix_keys: Tensor,
        prefix_values: Tensor,
        k: int,
        capacity: int,
        dtype: torch.dtype | None = None,
    ):
        if k <= 0 or capacity <= 0:
            raise ValueError(f"k and capacity must be > 0, got {k}, {capacity}")
        self.shape = shape
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values  # [L, 1, Hkv, P, D]
        self.prefix_len = prefix_keys.shape[3]
        self.capacity = capacity
        buffer_shape = (shape.n_layers, k, shape.n_kv_heads, capacity, shape.head_dim)
        dtype, device = dtype or prefix_keys.dtype, prefix_keys.device
        self.keys = torch.zeros(buffer_shape, dtype=dtype, device=device)  # [L, k, Hkv, S, D]
        self.values = torch.zeros(buffer_shape, dtype=dtype, device=device)  # [L, k, Hkv, S, D]
        self.lengths: list[int] = [0] * k  # generated entries per branch

    @classmethod
    def from_prompt(cls, prompt: RaggedKVCache, k: int, capacity: int, dtype: torch.dtype | None = None) -> "BranchKVCache":
        """Branches over row 0 of a prefilled batch-1 cache (a view, not a copy); branch
        buffers in `dtype` (default: the prompt cache's compute dtype, the model's)."""
        length = prompt.lengths[0]
        keys = prompt.keys[:, :1, :, :length]  # [L, 1, Hkv, P, D]
        values = prompt.values[:, :1, :, :length]
        return cls(prompt.shape, keys, values, k, capacity, dtype or prompt.compute_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held: the prefix once plus every branch buffer."""
        prefix = self.prefix_keys[:, :, :, : self.prefix_len]
        return 2 * (prefix.numel() * prefix.element_size() + self.keys.numel() * self.keys.element_size())

    def prepare(self, n_new: int) -> StepContext:
        device = self.keys.device
        if max(self.lengths) + n_new > self.capacity:
            raise InputError(f"branch length {max(self.lengths) + n_new} exceeds the branch capacity of {self.capacity}")
        layout = BranchLayout.build([n + n_new for n in self.lengths], n_new, self.keys.dtype, device, self.shape.sliding_window)
        write_positions = layout.lengths[:, None] + torch.arange(-n_new, 0, device=device)  # [k, T]
        rows = torch.arange(self.batch, device=device)[:, None]  # [k, 1]
        uniform = self.lengths[0] if min(self.lengths) == max(self.lengths) else None
        return _BranchStep(self.prefix_len + write_positions, n_new, write_positions, layout, rows, uniform)

    def branch_mask(self, step: StepContext) -> Tensor | None:
        """The branch piece's additive mask of this step ([k, 1, T, max(lengths)], the contract's
        masking rules: kernels/contract.py BranchLayout), None where every query sees every entry."""
        return _expect(step, _BranchStep).layout.branch_mask

    def write(self, layer: int, k: Tensor, v: Tensor, step: StepContext) -> None:
        """k/v [k, Hkv, T, D] into each branch's next T slots."""
        step = _expect(step, _BranchStep)
        if step.uniform_start is not None:  # every branch at the same length: one slice copy each
            stop = step.uniform_start + step.n_new
            self.keys[layer][:, :, step.uniform_start : stop] = k
            self.values[layer][:, :, step.uniform_start : stop] = v
            return
        self.keys[layer][step.rows, :, step.write_positions] = k.transpose(1, 2)  # [k, T, Hkv, D] by index
        self.values[layer][step.rows, :, step.write_positions] = v.transpose(1, 2)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, step: StepContext) -> Tensor:
        """q [k, H, T, D], k/v [k, Hkv, T, D] -> [k, H, T, D]."""
        from kspec.kernels.bifurcated import bifurcated_attention

        step = _expect(step, _BranchStep)
        self.write(layer, k, v, step)
        return bifurcated_attention(
            q,
            as_dtype(self.prefix_keys[layer], q.dtype),
            as_dtype(self.prefix_values[layer], q.dtype),
            self.keys[layer],
            self.values[layer],
            step.layout,
            sliding_window=self.shape.sliding_window,
        )

    def fork(self, source: int, target: int) -> None:
        """Make branch `target` a copy of branch `source` (its entries and length)."""
        length = self.lengths[source]
        self.keys[:, target, :, :length] = self.keys[:, source, :, :length]
        self.values[:, target, :, :length] = self.values[:, source, :, :length]
        self.lengths[target] = length

    def keep(self, rows: list[int]) -> None:
        """Only these branches stay (in this order); the others' buffers are released.
        Copies the branch buffers only (the prefix is shared and stays where it is)."""
        index = to_device(rows, torch.long, self.keys.device)
        self.keys = self.keys.index_select(1, index)  # [L, k', Hkv, S, D]
        self.values = self.values.index_select(1, index)
        self.lengths = [self.lengths[row] for row in rows]

    def branch_entries(self, branch: int) -> tuple[Tensor, Tensor]:
        """The valid K and V of one branch: [L, Hkv, len, D] each (views)."""
        length = self.lengths[branch]
        return self.keys[:, branch, :, :length], self.values[:, branch, :, :length]


@dataclass(frozen=True)
class _GroupStep(StepContext):
    parts: tuple[StepContext, ...] = ()


class BranchCacheGroup:
    """Several requests' branch caches verified in one forward pass (cross-request
    batching): rows are the concatenation of each cache's rows, in order. Projections and
    MLPs run once over all rows; attention runs per request, so each request keeps its
    own shared prefix (stored and read once for its k branches)."""

    def __init__(self, parts: Sequence[BranchKVCache]):
        if not parts:
            raise ValueError("a cache group needs at least one cache")
        self.parts = list(parts)
        self.sizes = [part.batch for part in self.parts]

    @property
    def batch(self) -> int:
        return sum(self.sizes)

    def prepare(self, n_new: int) -> StepContext:
        steps = tuple(part.prepare(n_new) for part in self.parts)
        positions = torch.cat([step.positions for step in steps])  # [B, T]
        return _GroupStep(positions, n_new, steps)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, step: StepContext) -> Tensor:
        """q [B, H, T, D], k/v [B, Hkv, T, D] with B = sum of the parts' rows -> [B, H, T, D]."""
        step = _expect(step, _GroupStep)
        outputs = [
            part.attend(layer, q_part, k_part, v_part, part_step)
            for part, part_step, q_part, k_part, v_part in zip(
                self.parts, step.parts, q.split(self.sizes), k.split(self.sizes), v.split(self.sizes)
            )
        ]
        return torch.cat(outputs)  # [B, H, T, D]

    def advance(self, n_kept: int | Sequence[int]) -> None:
        kept = [n_kept] * self.batch if isinstance(n_kept, int) else list(n_kept)
        if len(kept) != self.batch:
            raise ValueError(f"advance: got {len(kept)} counts for {self.batch} rows")
        offset = 0
        for part, size in zip(self.parts, self.sizes):
            part.advance(kept[offset : offset + size])
            offset += size
