"""Reuse of prompt KV across requests: consecutive keystrokes share almost all of their
prompt, so only the tokens after the longest common token prefix are prefilled.

Entries are whole prompts (a prefilled batch-1 cache each); a lookup takes the entry
with the longest common token prefix. A prompt that differs from its match only in the
last few tokens (the next keystroke in the same document) replaces it, so the budget
holds one entry per document rather than one per keystroke. LRU eviction under a byte
budget.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generator

import torch

from kspec.engine.api import CancelToken
from kspec.engine.errors import CancelledError
from kspec.engine.cache.kv import BranchKVCache, RaggedKVCache
from kspec.engine.models.transformer import Transformer


@dataclass(frozen=True)
class PrefixCacheConfig:
    max_bytes: int = 512 * 1024 * 1024
    min_reuse_tokens: int = 8  # a shorter common prefix is not worth the copy
    chunk_tokens: int = 256  # prefill in chunks; a cancel is honoured between chunks
    supersede_tokens: int = 16  # a new prompt that keeps all but at most this many tokens of its match replaces it

    def __post_init__(self) -> None:
        if self.max_bytes < 0:
            raise ValueError(f"prefix cache budget must be >= 0 bytes, got {self.max_bytes}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")


@dataclass
class Prefill:
    """A prompt's KV (row 0 of a batch-1 cache) and the logits after its last token."""

    cache: RaggedKVCache
    last_logits: torch.Tensor  # [V]
    reused_tokens: int  # how many prompt tokens came from the prefix cache


def common_prefix_length(a: tuple[int, ...], b: list[int]) -> int:
    limit = min(len(a), len(b))
    index = 0
    while index < limit and a[index] == b[index]:
        index += 1
    return index


# New tokens after a cached part up to which they run as one branch over it (`extend`): a
# keystroke's prompt differs from its cached match in a token or two
BRANCH_EXTEND_TOKENS = 16


def extend(model: Transformer, cache: RaggedKVCache, chunk: list[int]) -> torch.Tensor:
    """The hidden states [1, T, dim] of `chunk` after row 0 of a batch-1 cache, its K/V written
    into the cache (not yet counted: the caller advances). A few tokens after a cached part run
    as one branch over that part (BranchKVCache: the CPU fast path's C++ layer loop serves it,
    where the plain cache takes PyTorch's ops, ~35 a layer), then their K/V are copied in."""
    tokens = torch.tensor([chunk], device=model.device)  # [1, T]
    done = cache.lengths[0]
    if done == 0 or len(chunk) > BRANCH_EXTEND_TOKENS:
        return model(tokens, cache)
    branch = BranchKVCache.from_prompt(cache, 1, len(chunk))  # the cached part is its prefix (a view)
    hidden = model(tokens, branch)
    cache.keys[:, :1, :, done : done + len(chunk)] = branch.keys  # [L, 1, Hkv, T, D] (into the prompt's KV dtype)
    cache.values[:, :1, :, done : done + len(chunk)] = branch.values
    return hidden


class PrefixCache:
    def __init__(self, config: PrefixCacheConfig = PrefixCacheConfig()):
        self.config = config
        self._entries: OrderedDict[tuple[int, ...], RaggedKVCache] = OrderedDict()
        self.bytes_held = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest_match(self, ids: list[int]) -> tuple[tuple[int, ...], int] | None:
        best: tuple[tuple[int, ...], int] | None = None
        for key in self._entries:
            shared = common_prefix_length(key, ids)
            if shared >= self.config.min_reuse_tokens and (best is None or shared > best[1]):
                best = (key, shared)
        return best

    def prefill(self, model: Transformer, ids: list[int], cancel: CancelToken | None = None) -> Prefill:
        """The KV of `ids`, computing only what no cached prompt already holds.

        Runs in chunks and checks `cancel` between them: a cancelled prefill keeps what it
        computed as a cache entry (the next keystroke's prompt starts the same way) and
        raises CancelledError."""
        steps = self.prefill_steps(model, ids)
        while True:
            try:
                next(steps)
            except StopIteration as finished:
                return finished.value
            if cancel is not None and cancel.cancelled:
                steps.close()  # stores the partial KV
                raise CancelledError("cancelled during prefill")

    def prefill_steps(self, model: Transformer, ids: list[int]) -> Generator[None, None, Prefill]:
        """`prefill` one chunk at a time: yields between chunks, returns the Prefill.
        Closing it early stores what was computed (a batch of requests interleaves the
        chunks of a newcomer's prompt with the others' decode rounds)."""
        if not ids:
            raise ValueError("cannot prefill an empty prompt")
        cache = RaggedKVCache(model.cache_shape, 1, len(ids), model.kv_dtype, model.device, zero=False, compute_dtype=model.dtype)  # every slot written: reused, then chunks
        match = self.longest_match(ids)
        reused = 0
        superseded: tuple[int, ...] | None = None
        if match is not None:
            key, shared = match
            reused = min(shared, len(ids) - 1)  # at least one token runs, for the logits
            source = self._entries[key]
            cache.keys[:, :, :, :reused] = source.keys[:, :, :, :reused]
            cache.values[:, :, :, :reused] = source.values[:, :, :, :reused]
            cache.lengths = [reused]
            self._entries.move_to_end(key)
            if len(key) - shared <= self.config.supersede_tokens:
                superseded = key  # the same document a keystroke later: one entry per document, not one per keystroke
        done = reused
        while True:
            chunk = ids[done : done + self.config.chunk_tokens]
            with torch.inference_mode():
                hidden = extend(model, cache, chunk)  # [1, T, dim]
            cache.advance(len(chunk))
            done += len(chunk)
            if done == len(ids):
                break
            try:
                yield
            except GeneratorExit:
                self.store(tuple(ids[:done]), cache)
                raise
        with torch.inference_mode():
            logits = model.logits(hidden[0, -1])  # [V]
        if superseded is not None and superseded in self._entries and superseded != tuple(ids):
            self.bytes_held -= self._entries.pop(superseded).nbytes
        self.store(tuple(ids), cache)
        return Prefill(cache, logits, reused)

    def store(self, key: tuple[int, ...], cache: RaggedKVCache) -> None:
        if key in self._entries:
            self.bytes_held -= self._entries.pop(key).nbytes
        if cache.nbytes > self.config.max_bytes:
            return
        self._entries[key] = cache
        self.bytes_held += cache.nbytes
        while self.bytes_held > self.config.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes_held -= evicted.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes_held = 0


def prefill_uncached(model: Transformer, ids: list[int]) -> Prefill:
    """A cold prefill (no reuse): the baseline the prefix cache is measured against."""
    return PrefixCache(PrefixCacheConfig(max_bytes=0)).prefill(model, ids)
