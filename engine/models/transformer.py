"""The decoder: llama family (Llama, Qwen2, Mistral) and StarCoder2 in one short module.

Module names follow the HF checkpoints (`model.layers.N.self_attn.q_proj`, ...) so a
state dict loads as is. Attention goes through a KV cache object (engine/cache/kv.py) that
owns the buffers, the positions and the masks; the model never copies KV.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kspec.engine.cache.kv import CacheShape, KVCache, StepContext
from kspec.engine.models.args import ModelArgs
from kspec.engine.models.head_cost import HeadCost
from kspec.engine.models.rope import apply_rotary, inverse_frequencies, rotary_cos_sin


class LayerLoop(Protocol):
    """Runs every block of some forward passes another way (engine/models/native_step.py)."""

    def serves(self, cache: KVCache, rows: int, computed_rows: int | None = None) -> bool: ...

    def __call__(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: Any, step: StepContext, n_layers: int | None,
        row_lengths: Sequence[int] | None = None,
    ) -> Tensor:  # fmt: skip
        """x [B, T, dim] -> the residual stream after the blocks [B, T, dim], over a cache `serves`
        took and the step it prepared; with row_lengths, only each row's first tokens are
        computed (the rest of the output is zeros)."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x * rsqrt(mean(x^2) + eps) * weight in one fused op (float32: bitwise the formula;
        half types: accumulated in float32, rounded once)."""
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(args: ModelArgs) -> nn.Module:
    return nn.LayerNorm(args.dim, eps=args.norm_eps) if args.layer_norm else RMSNorm(args.dim, args.norm_eps)


def _activation(name: str) -> nn.Module:
    return nn.SiLU() if name == "silu" else nn.GELU(approximate="tanh" if name == "gelu_pytorch_tanh" else "none")


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=args.o_bias)
        self.qkv_proj: nn.Module | None = None  # set by fuse(): one matmul for q, k and v
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None  # qwen3
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None

    def fuse(self, qkv_proj: nn.Module, o_proj: nn.Module) -> None:
        """Replace q/k/v_proj by one projection whose output is [q | k | v] (and o_proj)."""
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj, self.o_proj = qkv_proj, o_proj

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int, step: StepContext) -> Tensor:
        batch, n_new, _ = x.shape  # [B, T, dim]
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        if self.qkv_proj is None:
            q = self._head_norm(self.q_proj(x).view(batch, n_new, heads, head_dim), self.q_norm)  # [B, T, H, D]
            k = self._head_norm(self.k_proj(x).view(batch, n_new, kv_heads, head_dim), self.k_norm)  # [B, T, Hkv, D]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            v = self.v_proj(x).view(batch, n_new, kv_heads, head_dim)  # [B, T, Hkv, D]
        else:
            qkv = self.qkv_proj(x).view(batch, n_new, heads + 2 * kv_heads, head_dim)  # [B, T, H+2Hkv, D]
            qk = qkv[:, :, : heads + kv_heads]  # [B, T, H+Hkv, D]
            if self.q_norm is not None:
                qk = torch.cat([self._head_norm(qk[:, :, :heads], self.q_norm), self._head_norm(qk[:, :, heads:], self.k_norm)], dim=2)
            qk = apply_rotary(qk, cos, sin)  # q and k rotated in one go (cos's dtype)
            q, k, v = qk[:, :, :heads], qk[:, :, heads:], qkv[:, :, heads + kv_heads :].to(qk.dtype)
        out = cache.attend(layer, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), step)  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(batch, n_new, heads * head_dim))


    @staticmethod
    def _head_norm(heads: Tensor, norm: nn.Module | None) -> Tensor:
        """[..., heads, D] through a per-head RMSNorm over D (qwen3's q_norm / k_norm), if any."""
        return heads if norm is None else norm(heads)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gated = args.gated_mlp
        self.act = _activation(args.activation)
        if self.gated:
            self.gate_proj = nn.Linear(args.dim, args.intermediate_size, bias=args.mlp_bias)
            self.up_proj = nn.Linear(args.dim, args.intermediate_size, bias=args.mlp_bias)
            self.down_proj = nn.Linear(args.intermediate_size, args.dim, bias=args.mlp_bias)
        else:
            self.c_fc = nn.Linear(args.dim, args.intermediate_size, bias=args.mlp_bias)
            self.c_proj = nn.Linear(args.intermediate_size, args.dim, bias=args.mlp_bias)
        self.gate_up_proj: nn.Module | None = None  # set by fuse(): one matmul for gate and up

    def fuse(self, gate_up_proj: nn.Module, down_proj: nn.Module) -> None:
        """Gated MLP: replace gate/up_proj by one projection whose output is [gate | up]."""
        if not self.gated:
            raise ValueError("only a gated MLP has a gate and an up projection to fuse")
        del self.gate_proj, self.up_proj
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [B, T, I] each
            return self.down_proj(self.act(gate) * up)
        if self.gated:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.input_layernorm = _norm(args)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = _norm(args)
        self.mlp = MLP(args)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int, step: StepContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, step)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """`model.*` in HF checkpoints: embeddings, blocks, final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        # nn.Embedding's own init (normal_) on the meta device, where a checkpoint's model is built,
        # runs a Python reference that imports torch._dynamo: 2-5 s of every daemon (re)start.
        # The weight is made empty instead and initialised as nn.Embedding would only where it holds memory.
        weight = torch.empty(args.vocab_size, args.dim)
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim, _weight=weight)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = _norm(args)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer(
            "inv_freq", inverse_frequencies(args.head_dim, args.rope_theta, args.rope_scaling), persistent=False
        )
        self.native_steps: LayerLoop | None = None  # the CPU fast path's C++ layer loop (cpu_fast.to_fast_path)
        self.kernel_choice: Any = None  # the CPU fast path's measured KernelChoice (engine/models/kernel_choice.py), None where none was measured
        self.prompt_kv_dtype: torch.dtype | None = None  # a prompt's KV stored in this dtype; None: the model's (cpu_fast.to_fast_path)
        self.head_cost: HeadCost | None = None  # what a call of the head costs where its rows do not depend on the call (cpu_fast.to_fast_path, the machine fit)

    @property
    def cache_shape(self) -> CacheShape:
        a = self.args
        return CacheShape(a.n_layers, a.n_kv_heads, a.head_dim, a.sliding_window)

    @property
    def dtype(self) -> torch.dtype:
        """Of activations and the KV cache (the final norm's; projections and the embedding may
        hold other forms, e.g. 4-bit codes)."""
        return self.model.norm.weight.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """Of a prompt's KV cache (prefill, the prefix cache, the branches' shared prefix); the
        branches' own entries are in `dtype`."""
        return self.prompt_kv_dtype or self.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def forward(
        self, tokens: Tensor, cache: KVCache, n_layers: int | None = None, row_lengths: Sequence[int] | None = None
    ) -> Tensor:
        """tokens [B, T] -> final hidden states [B, T, dim]. The caller advances the cache.
        n_layers: run only the first n blocks (early exit, for a layer-skip drafter).
        row_lengths: each row's real tokens, the rest padding whose states nobody reads (a
        verification's drafts shorter than the longest); a pass the C++ layer loop serves
        computes only the real ones."""
        step = cache.prepare(tokens.shape[1])
        cos, sin = rotary_cos_sin(step.positions, self.inv_freq, self.dtype)  # [B, T, 1, D]
        x = self.model.embed_tokens(tokens)  # [B, T, dim]
        native = self.native_steps
        computed = sum(row_lengths) if row_lengths is not None else None
        if native is not None and native.serves(cache, tokens.numel(), computed):
            return self.model.norm(native(x, cos, sin, cache, step, n_layers, row_lengths))
        for index, block in enumerate(islice(self.model.layers, n_layers)):  # a slice would build a new ModuleList per call
            x = block(x, cos, sin, cache, index, step)
        return self.model.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., dim] -> float32 logits [..., V]."""
        return self.lm_head(hidden).float()

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """One decode step for every row: tokens [B, T] -> logits of the last position [B, V]; advances T."""
        hidden = self(tokens, cache)
        cache.advance(tokens.shape[1])
        return self.logits(hidden[:, -1])


class EarlyExit(nn.Module):
    """The first `n_layers` blocks of a model with its final norm and head: a draft model
    that shares the target's weights and tokenizer (layer-skip drafting)."""

    def __init__(self, base: Transformer, n_layers: int):
        super().__init__()
        if not 1 <= n_layers <= base.args.n_layers:
            raise ValueError(f"early exit after {n_layers} layers: the model has {base.args.n_layers}")
        self.base, self.n_layers = base, n_layers
        self.args = base.args

    @property
    def cache_shape(self) -> CacheShape:
        shape = self.base.cache_shape
        return CacheShape(self.n_layers, shape.n_kv_heads, shape.head_dim, shape.sliding_window)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.base.kv_dtype

    @property
    def device(self) -> torch.device:
        return self.base.device

    def forward(self, tokens: Tensor, cache: KVCache) -> Tensor:
        return self.base(tokens, cache, self.n_layers)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.base.logits(hidden)

    def step(self, tokens: Tensor, cache: KVCache) -> Tensor:
        hidden = self(tokens, cache)
        cache.advance(tokens.shape[1])
        return self.logits(hidden[:, -1])


def init_random(args: ModelArgs, seed: int, dtype: torch.dtype = torch.float32) -> Transformer:
    """A randomly initialised model (tests and benchmarks), deterministic for a seed."""
    generator = torch.Generator().manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    return model.to(dtype).eval()
