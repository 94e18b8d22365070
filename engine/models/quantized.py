"""4-bit weights as a Q4 GGUF file stores them, multiplied by PyTorch's CPU int4 kernel.

GGUF Q4_0 and Q4_1 blocks hold 32 weights of one row with a shared scale d (Q4_1 also a
minimum m), codes q in 0..15:

    Q4_0: w = d * (q - 8)            Q4_1: w = d * q + m

`torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)` computes with
w = (q - 8) * s + z per group of 32, so the file's own codes are used unchanged:
s = d and z = 0 (Q4_0) or z = m + 8 d (Q4_1). Dequantizing through the kernel gives back the
file's float32 dequantization exactly when s and z are float32.

The kernel is vectorized (AVX-512) for bfloat16 activations only; with float32 or float16
activations it takes a scalar path 10-40x slower than the bfloat16 one (measured, 2 threads).
So this path computes in bfloat16: the codes are exact, s and z are rounded to bfloat16
(relative error <= 2^-9, the same order as the bfloat16 activations themselves).

With few rows (a decode step) the kernel reads 4-bit weights: ~4x fewer bytes than bfloat16.
With many rows it dequantizes the weights again for every 4 rows, so there a dense bfloat16
copy (AMX) is faster: `CpuLinear` keeps both and picks by the row count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

GROUP = 32  # weights per GGUF Q4 block = the kernel's group size
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}  # fp16 d [+ fp16 m] + 16 bytes of codes
Q4_TYPES = tuple(_BLOCK_BYTES)


@dataclass(frozen=True)
class Q4Codes:
    """One weight matrix [N, K] in groups of 32 along K: w = (q - 8) * scale + zero."""

    codes: Tensor  # [N, K] uint8, 0..15
    scale: Tensor  # [N, K/32] float32
    zero: Tensor  # [N, K/32] float32

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        if k % GROUP:
            raise ValueError(f"4-bit weights need K divisible by {GROUP}, got K={k}")
        for name in ("scale", "zero"):
            if getattr(self, name).shape != (n, k // GROUP):
                raise ValueError(f"{name} must be [{n}, {k // GROUP}], got {tuple(getattr(self, name).shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def dequantize(self) -> Tensor:
        """[N, K] float32, as the kernel sees the weights with float32 group parameters."""
        n, k = self.shape
        q = self.codes.to(torch.float32).view(n, k // GROUP, GROUP) - 8  # [N, K/32, 32]
        return (q * self.scale[..., None] + self.zero[..., None]).view(n, k)

    @classmethod
    def from_gguf_blocks(cls, blocks: np.ndarray, kind: str) -> "Q4Codes":
        """blocks [N, K/32 * block bytes] uint8 (a GGUF tensor's data) of type Q4_0 or Q4_1."""
        if kind not in _BLOCK_BYTES:
            raise ValueError(f"not a 4-bit GGUF type: {kind}; supported: {', '.join(Q4_TYPES)}")
        rows = blocks.shape[0]
        per_block = blocks.reshape(rows, -1, _BLOCK_BYTES[kind])  # [N, K/32, bytes]
        scale = per_block[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K/32]
        if kind == "Q4_1":
            minimum = per_block[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
            zero = minimum + 8 * scale
        else:
            zero = np.zeros_like(scale)
        packed = per_block[..., -16:]  # [N, K/32, 16]: weight j in the low nibble of byte j, j+16 in the high one
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)  # [N, K]
        return cls(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero))

    @classmethod
    def quantize(cls, weight: Tensor) -> "Q4Codes":
        """Q4_1-style quantization of a float matrix [N, K] (min/max per group): random test models."""
        n, k = weight.shape
        groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
        low, high = groups.amin(-1), groups.amax(-1)  # [N, K/32]
        scale = ((high - low) / 15).clamp_min(1e-8)
        codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
        return cls(codes.reshape(n, k), scale, low + 8 * scale)

    def permute_rows(self, order: Tensor) -> "Q4Codes":
        """Rows reordered: order [N] (e.g. undoing llama.cpp's rotary interleave)."""
        return Q4Codes(self.codes[order], self.scale[order], self.zero[order])


Q4_FILE = "q4.safetensors"  # next to a converted GGUF's model.safetensors: its 4-bit weights as stored


def save_q4(codes: Mapping[str, Q4Codes], path: Path) -> None:
    """Write 4-bit weights compactly (two codes a byte, low nibble first) to a safetensors file."""
    tensors: dict[str, Tensor] = {}
    for name, q4 in codes.items():
        pairs = q4.codes.view(q4.shape[0], -1, 2)  # [N, K/2, 2]
        tensors[f"{name}.codes"] = (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()  # [N, K/2] uint8
        tensors[f"{name}.scale"] = q4.scale.contiguous()
        tensors[f"{name}.zero"] = q4.zero.contiguous()
    save_file(tensors, str(path), metadata={"format": "kspec-q4", "group": str(GROUP)})


def load_q4(path: Path) -> dict[str, Q4Codes]:
    """Every weight `save_q4` wrote, by name (see Q4File to read them one at a time)."""
    with Q4File(path) as q4:
        return {name: q4[name] for name in q4}


class Q4File(Mapping[str, Q4Codes]):
    """The weights of a `save_q4` file, each read when asked for (a model converts one layer at
    a time without holding every layer's unpacked codes). Use as a context manager."""

    def __init__(self, path: Path):
        self._handle = safe_open(str(path), "pt")
        self._names = sorted({key.rsplit(".", 1)[0] for key in self._handle.keys()})

    def __enter__(self) -> "Q4File":
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle = None  # closes the file

    def __getitem__(self, name: str) -> Q4Codes:
        if name not in self._names:
            raise KeyError(name)
        nibbles = self._handle.get_tensor(f"{name}.codes")  # [N, K/2]
        codes = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=-1).view(nibbles.shape[0], -1)  # [N, K]
        return Q4Codes(codes, self._handle.get_tensor(f"{name}.scale"), self._handle.get_tensor(f"{name}.zero"))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def cat_rows(parts: Sequence[Q4Codes]) -> Q4Codes:
    """Stack matrices with the same K along N (a fused projection)."""
    return Q4Codes(
        torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]), torch.cat([p.zero for p in parts])
    )


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


class CpuLinear(nn.Module):
    """y = x W^T (+ b) in bfloat16 from 4-bit weights (rows <= int4_max_rows) or a dense copy.

    Either form may be absent: without codes the dense weight serves every call; without
    the dense copy the 4-bit kernel does (slower for many rows, smaller in memory)."""

    def __init__(
        self,
        dense: Tensor | None,
        codes: Q4Codes | None,
        bias: Tensor | None,
        int4_max_rows: int,
        dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__()
        if dense is None and codes is None:
            raise ValueError("a linear layer needs dense weights or 4-bit codes")
        shape = tuple(dense.shape) if dense is not None else codes.shape  # type: ignore[union-attr]
        if dense is not None and codes is not None and tuple(codes.shape) != shape:
            raise ValueError(f"4-bit codes {codes.shape} do not match the dense weight {shape}")
        self.out_features, self.in_features = shape
        self.int4_max_rows = int4_max_rows
        self.dense: Tensor | None
        self.packed: Tensor | None
        self.scales_zeros: Tensor | None
        self.bias: Tensor | None
        self.register_buffer("dense", None if dense is None else dense.detach().to(dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        packed, scales_zeros = (None, None) if codes is None else _pack(codes, dtype)
        self.register_buffer("packed", packed)  # [N, K/2] uint8, the kernel's layout
        self.register_buffer("scales_zeros", scales_zeros)  # [K/32, N, 2]

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N]."""
        rows = x.numel() // self.in_features
        if self.packed is not None and (self.dense is None or rows <= self.int4_max_rows):
            flat = x.reshape(rows, self.in_features)  # [M, K]
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)  # [M, N]
            out = out.view(*x.shape[:-1], self.out_features)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.dense, self.bias)

    def extra_repr(self) -> str:
        forms = [name for name, t in (("int4", self.packed), ("dense", self.dense)) if t is not None]
        return f"{self.in_features} -> {self.out_features}, {'+'.join(forms)}, int4 up to {self.int4_max_rows} rows"


def _pack(codes: Q4Codes, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """-> packed [N, K/2] uint8, scales_zeros [K/32, N, 2] in dtype."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.to(torch.int32), 1)
    scales_zeros = torch.stack([codes.scale.t(), codes.zero.t()], dim=-1).to(dtype).contiguous()  # [K/32, N, 2]
    return packed, scales_zeros


def fused_linear(
    linears: Sequence[nn.Linear], codes: Sequence[Q4Codes | None], int4_max_rows: int, keep_dense: bool = True
) -> CpuLinear:
    """One CpuLinear for several linear layers over the same input (outputs concatenated).
    4-bit only when every part has codes; the dense copy is kept unless keep_dense is False."""
    dense = torch.cat([linear.weight.detach() for linear in linears])  # [sum N, K]
    biases = [linear.bias for linear in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(l.out_features, dtype=dense.dtype) for b, l in zip(biases, linears)]
    )
    have_codes = all(c is not None for c in codes) and int4_kernel_available()
    q4 = cat_rows([c for c in codes if c is not None]) if have_codes else None
    return CpuLinear(dense if keep_dense or q4 is None else None, q4, bias, int4_max_rows)
