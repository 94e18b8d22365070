"""The CPU fast path (`--dtype auto` on an AVX-512 CPU): bfloat16 compute, one
matmul for q/k/v and one for gate/up, and a Q4 GGUF's own 4-bit weights for steps with few rows.

Why each piece (2 threads, SmolLM2-135M, a 512-token prompt; README "Measured"):
- a decode step reads every weight once: 4-bit codes are ~4x fewer bytes than bfloat16 and
  ~8x fewer than float32, and PyTorch's int4 CPU kernel multiplies them without unpacking;
- with many rows (verifying k x (gamma+1) drafts, prefill) that kernel dequantizes the weights
  again for every 4 rows, while a dense bfloat16 matmul does not (oneDNN; AMX where the CPU
  has it): `CpuLinear` keeps both forms and picks by the row count (`FastPath.int4_max_rows`,
  the measured crossover);
- fusing projections halves the number of small matmuls a step launches.
Weights without 4-bit codes (an HF folder, a GGUF in another type) run in dense bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from kspec.engine.models.quantized import CpuLinear, Q4Codes, fused_linear, int4_kernel_available
from kspec.engine.models.transformer import Transformer

FAST_CAPABILITIES = ("AVX512",)  # torch's CPU kernel levels the fast path was measured on


@dataclass(frozen=True)
class FastPath:
    int4_max_rows: int = 16  # 4-bit kernel up to this many rows per matmul, dense bfloat16 above
    keep_dense: bool = True  # False: 4-bit only (less memory, slower verification and prefill)

    def __post_init__(self) -> None:
        if self.int4_max_rows < 0:
            raise ValueError(f"int4_max_rows must be >= 0, got {self.int4_max_rows}")


def fast_path_available() -> bool:
    """Whether this CPU runs the fast path's kernels vectorized: PyTorch's int4 kernel (its
    AVX-512 path takes bfloat16 activations) and bfloat16 matmuls (oneDNN; AVX-512-BF16 / AMX
    make them faster still, but plain AVX-512 already beats float32: README "Measured")."""
    return torch.backends.cpu.get_cpu_capability() in FAST_CAPABILITIES and int4_kernel_available()


def to_fast_path(model: Transformer, codes: Mapping[str, Q4Codes], path: FastPath = FastPath()) -> Transformer:
    """Turn a loaded model into the fast path, in place (returns it): bfloat16 everywhere,
    q/k/v and gate/up fused, 4-bit weights where `codes` (by HF weight name) has every part."""
    model.to(torch.bfloat16)
    for index, block in enumerate(model.model.layers):
        prefix = f"model.layers.{index}."

        def linear(*names: str) -> CpuLinear:
            modules = [block.get_submodule(name) for name in names]
            parts = [codes.get(f"{prefix}{name}.weight") for name in names]
            return fused_linear(modules, parts, path.int4_max_rows, path.keep_dense)

        attention, mlp = block.self_attn, block.mlp
        attention.fuse(linear("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), linear("self_attn.o_proj"))
        if mlp.gated:
            mlp.fuse(linear("mlp.gate_proj", "mlp.up_proj"), linear("mlp.down_proj"))
        else:
            mlp.c_fc, mlp.c_proj = linear("mlp.c_fc"), linear("mlp.c_proj")
    return model


def describe(model: Transformer) -> str:
    """What a user sees of the compute path, e.g. 'bfloat16 + int4 (up to 16 rows)'."""
    linears = [m for m in model.modules() if isinstance(m, CpuLinear)]
    if not linears:
        return str(model.dtype).removeprefix("torch.")
    int4 = [m for m in linears if m.packed is not None]
    if not int4:
        return "bfloat16 (fused projections)"
    return f"bfloat16 + int4 from the GGUF ({len(int4)}/{len(linears)} projections, up to {int4[0].int4_max_rows} rows)"
