"""Branch steps of the CPU fast path through one C++ call for every layer
(``kernels/cpu_layers.py``): which models and steps it serves, and its weights gathered once.

It serves what a keystroke runs most: a forward pass of few rows (k branches x T new tokens,
up to the projections' own 4-bit limit, ``CpuLinear.int4_max_rows``, or ``LOOP_INT4_ROWS``
where that is larger and the dense copy bfloat16; the loop always multiplies the 4-bit terms)
over a ``BranchKVCache`` (one shared prefix, each branch's own entries), for a llama-family
or StarCoder2 model on the fast path:
RMSNorm, or StarCoder2's LayerNorm with its bias; q|k|v fused into one 4-bit matmul (a bias and
Qwen3's per-head q/k norms allowed), o (a bias allowed), then a SiLU-gated MLP (gate|up, down) or
StarCoder2's ungated one (c_fc with its bias, tanh GELU, c_proj with its bias), every matmul 4-bit
and on the same kernel (PyTorch's int4 one or kspec's 4-bit x 8-bit one, quantized.py); no key
hidden by a sliding window. The kinds are read from the modules (`_kinds`): an erf GELU, a bias
before a gated MLP's SiLU, or layers of mixed forms take the PyTorch ops, as does everything
else (prefill, verification above the row limit, several requests batched, float32).

Measured (`kspec bench step --paths auto,auto/torch`: default model, 512-token prompt,
2 threads, a step with its logits; docs/measurements/avx512-bf16-no-amx.md): k = 1 11.9 -> 6.7 ms, k = 4
15.6 -> 10.5 ms, k = 8 21.7 -> 15.4 ms against the PyTorch ops.
Numbers: within bfloat16 rounding of the PyTorch fast path (tests/unit/models/test_native_step.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeGuard

import torch
from torch import Tensor, nn

from kspec.engine.cache.kv import BranchKVCache, KVCache, StepContext
from kspec.engine.models.quantized import Q4Q8_TILE, CpuLinear, Int4Term, TiledTerm
from kspec.engine.models.transformer import RMSNorm, Transformer

# Rows the loop takes with the 4-bit terms even where the PyTorch path switches to a dense copy
# above 4 (cpu_profile.INT4_MAX_ROWS): a k = 8 step, 8 rows, took 21.0 ms through the dense
# bfloat16 copy and PyTorch ops vs 15.6 ms through the loop on 4-bit weights (default model,
# AVX-512-BF16 VM, one process); 40 verification rows stay faster dense (46 vs 58 ms).
LOOP_INT4_ROWS = 8

# The prompt's KV the loop reads (the branches' own entries are float32): float16 halves what a
# step reads of a long prompt (branch_layers.cpp converts it a chunk of rows at a time)
PREFIX_KV_DTYPES = (torch.float32, torch.float16)


@dataclass(frozen=True)
class LayerWeights:
    """What the C++ loop reads of every layer, in layer order (the model's own tensors); the
    fields of its `LoopModel` (kernels/csrc/branch_layers.cpp), by name."""

    input_norm: list[Tensor]  # [dim] float32
    input_norm_bias: list[Tensor]  # [dim] float32 per layer (StarCoder2's LayerNorm), or empty (RMSNorm)
    qkv_packed: list[Tensor]  # the 4-bit kernel's layout of q|k|v (PyTorch's int4 one or kspec's)
    qkv_scales: list[Tensor]  # its group parameters: [dim/32, (H + 2 Hkv) D, 2] bfloat16, or kspec's params (any form's)
    qkv_bias: list[Tensor]  # [(H + 2 Hkv) D] float32 per layer, or empty
    q_norm: list[Tensor]  # [D] float32 per layer (Qwen3's per-head norms, before rotary), or empty
    k_norm: list[Tensor]
    o_packed: list[Tensor]
    o_scales: list[Tensor]
    o_bias: list[Tensor]  # [dim] float32 per layer, or empty
    post_norm: list[Tensor]
    post_norm_bias: list[Tensor]
    gate_up_packed: list[Tensor]  # gate|up of a SiLU-gated MLP, or StarCoder2's c_fc
    gate_up_scales: list[Tensor]
    gate_up_bias: list[Tensor]  # c_fc's [I] float32 per layer (GELU MLP), or empty (gated: none served)
    down_packed: list[Tensor]  # down, or c_proj
    down_scales: list[Tensor]
    down_bias: list[Tensor]  # [dim] float32 per layer, or empty


class NativeSteps:
    """Runs `Transformer.forward`'s layer loop in C++ where `serves` says so."""

    def __init__(
        self, weights: LayerWeights, op: Callable[..., Tensor], heads: int, kv_heads: int, eps: float, max_rows: int | None,
        sliding_window: int | None = None, norm: str = "rms", mlp: str = "silu_gated",
    ):  # fmt: skip
        self.weights, self.op = weights, op
        # the model as the loop reads it, built and checked once: its weights, heads, eps and kinds
        # ("rms" or "layer"; "silu_gated" or "gelu_tanh": _kinds); registered by the op's library
        self.loop_model = torch.classes.kspec.LoopModel(**vars(weights), heads=heads, kv_heads=kv_heads, eps=eps, norm=norm, mlp=mlp)
        self.max_rows = max_rows  # rows every projection multiplies with its 4-bit terms; None: any (no dense copy)
        self.sliding_window = sliding_window  # served only while it hides no key

    @classmethod
    def for_model(cls, model: Transformer, load: Callable[[], Callable[..., Tensor] | None]) -> "NativeSteps | None":
        """For a fast-path Transformer whose every layer has the served form, else None;
        `load` gives the op (kernels/cpu_layers.py) and is called only for such a model."""
        args, parts = model.args, []
        kinds = _kinds(model)
        if model.dtype != torch.float32 or kinds is None:
            return None
        norm, mlp_kind = kinds
        for block in model.model.layers:
            attention, mlp = block.self_attn, block.mlp
            first, second = (mlp.gate_up_proj, mlp.down_proj) if mlp.gated else (mlp.c_fc, mlp.c_proj)
            linears = (attention.qkv_proj, attention.o_proj, first, second)
            norms = (block.input_layernorm, block.post_attention_layernorm)
            if not all(_one_int4_term(m) for m in linears):
                return None
            if mlp.gated and first.bias is not None:  # a bias before the SiLU: not in the loop
                return None
            parts.append((norms, linears))
        terms = [[_term_tensors(m.terms[0]) for m in linears] for _, linears in parts]
        if len({t[0][1].dtype == torch.bfloat16 for t in terms}) != 1:  # the loop takes one kernel for every matmul (bfloat16: PyTorch's)
            return None
        biases = [[linears[i].bias for _, linears in parts] for i in range(4)]  # per projection, per layer
        if any(any(b is None for b in layers) and not all(b is None for b in layers) for layers in biases):
            return None  # a bias in some layers only
        norm_biases = [[n[i].bias.detach() for n, _ in parts] if norm == "layer" else [] for i in range(2)]
        weights = LayerWeights(
            input_norm=[norms[0].weight.detach() for norms, _ in parts], input_norm_bias=norm_biases[0],
            qkv_packed=[t[0][0] for t in terms], qkv_scales=[t[0][1] for t in terms],
            qkv_bias=[b for b in biases[0] if b is not None],
            q_norm=[block.self_attn.q_norm.weight.detach() for block in model.model.layers] if args.qk_norm else [],
            k_norm=[block.self_attn.k_norm.weight.detach() for block in model.model.layers] if args.qk_norm else [],
            o_packed=[t[1][0] for t in terms], o_scales=[t[1][1] for t in terms], o_bias=[b for b in biases[1] if b is not None],
            post_norm=[norms[1].weight.detach() for norms, _ in parts], post_norm_bias=norm_biases[1],
            gate_up_packed=[t[2][0] for t in terms], gate_up_scales=[t[2][1] for t in terms],
            gate_up_bias=[b for b in biases[2] if b is not None],
            down_packed=[t[3][0] for t in terms], down_scales=[t[3][1] for t in terms], down_bias=[b for b in biases[3] if b is not None],
        )  # fmt: skip
        dense = [m for _, linears in parts for m in linears if m.has_dense]
        max_rows = min((m.int4_max_rows for m in dense), default=None)
        if max_rows == 0:  # dense weights asked for at every row count: nothing for the loop
            return None
        if max_rows is not None and all(m.dense_dtype == torch.bfloat16 for m in dense):
            max_rows = max(max_rows, LOOP_INT4_ROWS)  # measured against the bfloat16 copy
        op = load()
        if op is None:
            return None
        return cls(weights, op, args.n_heads, args.n_kv_heads, args.norm_eps, max_rows, args.sliding_window, norm, mlp_kind)

    def serves(self, cache: KVCache, rows: int, computed_rows: int | None = None) -> TypeGuard[BranchKVCache]:
        """Whether a forward pass of this many rows (padded: k x T) over this cache runs here,
        computing `computed_rows` of them (default: all)."""
        if not isinstance(cache, BranchKVCache) or rows < 1 or rows % cache.batch:
            return False
        if self.max_rows is not None and (computed_rows or rows) > self.max_rows:
            return False
        if self.sliding_window is not None and cache.prefix_len + max(cache.lengths) + rows // cache.batch > self.sliding_window:
            return False
        prefix_k, prefix_v = cache.prefix_keys, cache.prefix_values
        return (
            cache.keys.is_contiguous() and cache.values.is_contiguous() and cache.keys.dtype == torch.float32
            and prefix_k.stride(-1) == 1 and prefix_k.stride() == prefix_v.stride() and prefix_k.dtype in PREFIX_KV_DTYPES
            and prefix_v.dtype == prefix_k.dtype
        )  # fmt: skip

    def __call__(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: BranchKVCache, step: StepContext, n_layers: int | None,
        row_lengths: Sequence[int] | None = None,
    ) -> Tensor:  # fmt: skip
        """x [k, T, dim] (embeddings), cos/sin [k, T, 1, D], `step` from cache.prepare -> the
        residual stream after the layers [k, T, dim]; writes each layer's new keys and values
        into the branch buffers. row_lengths: only each branch's first row_lengths[b] tokens are
        computed and written (their states are the same as in the padded pass: no query sees a
        later one); the other rows of the output are zeros."""
        k, new, dim = x.shape
        rows = k * new
        padded_rows: list[int] = []  # all k T rows
        if row_lengths is not None and sum(row_lengths) < rows:
            padded_rows = [b * new + t for b, length in enumerate(row_lengths) for t in range(length)]
        x, cos, sin = (part.reshape(rows, -1) for part in (x, cos, sin))  # [k T, ...]
        if padded_rows:
            places = torch.tensor(padded_rows)  # [N]
            x, cos, sin = x[places], cos[places], sin[places]  # [N, ...]
        out = self.op(
            self.loop_model, x=x, cos=cos, signed_sin=sin,
            prefix_k=cache.prefix_keys, prefix_v=cache.prefix_values, branch_k=cache.keys, branch_v=cache.values,
            branch_mask=cache.branch_mask(step), lengths=cache.lengths, padded_rows=padded_rows, n_new=new, n_layers=n_layers,
        )  # fmt: skip  # [N, dim]
        if padded_rows:
            out = out.new_zeros(rows, dim).index_copy_(0, places, out)  # [k T, dim]
        return out.view(k, new, dim)  # [k, T, dim]


def _kinds(model: Transformer) -> tuple[str, str] | None:
    """The loop's norm and MLP kinds of this model's every layer, from its modules: ("rms" for
    RMSNorm, "layer" for a LayerNorm with weight and bias, of the model's eps; "silu_gated" for a
    gated SiLU MLP, "gelu_tanh" for an ungated one of tanh GELU); None where a layer has another."""
    found = set()
    for block in model.model.layers:
        norms, mlp = (block.input_layernorm, block.post_attention_layernorm), block.mlp
        if all(isinstance(n, RMSNorm) for n in norms):
            norm = "rms"
        elif all(isinstance(n, nn.LayerNorm) and n.weight is not None and n.bias is not None and n.eps == model.args.norm_eps for n in norms):
            norm = "layer"
        else:
            return None
        if mlp.gated and isinstance(mlp.act, nn.SiLU):
            kind = "silu_gated"
        elif not mlp.gated and isinstance(mlp.act, nn.GELU) and mlp.act.approximate == "tanh":
            kind = "gelu_tanh"
        else:
            return None
        found.add((norm, kind))
    return found.pop() if len(found) == 1 else None


def _one_int4_term(module: nn.Module | None) -> bool:
    if not isinstance(module, CpuLinear) or len(module.terms) != 1:
        return False
    term = module.terms[0]
    return not isinstance(term, TiledTerm) or term.codes.shape[0] * Q4Q8_TILE == term.out_features  # unpadded


def _term_tensors(term: nn.Module) -> tuple[Tensor, Tensor]:
    """A 4-bit term's weights as its kernel takes them: (codes, float16 params) of kspec's
    4-bit x 8-bit kernel or (packed, bfloat16 scales_zeros) of PyTorch's int4 one."""
    if isinstance(term, TiledTerm):  # either form: the loop tells them by the codes' shape
        return term.codes, term.params
    assert isinstance(term, Int4Term)
    return term.packed, term.scales_zeros
