"""Quantized weights on the CPU and the matmuls that read them without unpacking: the 4-bit form
(GGUF Q4_0 / Q4_1 / Q4_K codes, for PyTorch's CPU int4 kernel or kspec's 4-bit x 8-bit one:
`Int4Term`, `Q4Q8Term`), the 8-bit form (`Q8Q8Term`: Q8_0, and Q5_x / Q6_K where no 5- or 6-bit
loop is built), the 5-bit form (`Q5Q8Term`) and the 6-bit one (`Q6Q8Term`: Q6_K's own codes and
scales per 16 weights, `SixBitCodes`); `CpuLinear` sums a weight's terms and keeps a dense copy
where the CPU's profile says so (cpu_profile.py). How each GGUF type becomes these terms:
gguf_blocks.py.

GGUF Q4_0 and Q4_1 blocks hold 32 weights of one row with a shared scale d (Q4_1 also a
minimum m), codes q in 0..15:

    Q4_0: w = d * (q - 8)            Q4_1: w = d * q + m

`torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)` computes with
w = (q - 8) * s + z per group of 32, so the file's own codes are used unchanged:
s = d and z = 0 (Q4_0) or z = m + 8 d (Q4_1). Dequantizing through the kernel gives back the
file's float32 dequantization exactly when s and z are float32.

The kernel is vectorized (AVX-512) for bfloat16 activations only; with float32 or float16
activations it takes a scalar path 10-40x slower than the bfloat16 one (measured, 2 threads).
So its inputs and outputs are bfloat16: the codes are exact, s and z are rounded to bfloat16
(relative error <= 2^-9, the same order as the bfloat16 activations themselves).

A Q8_0 block (w = d * q, q in -127..127; the default model's tied embedding / lm_head) is two
such 4-bit terms: with q + 128 = 16 h + l (h, l in 0..15), w = 16 d (h - 8) + [d (l - 8) + 8 d],
so `CpuLinear` sums two kernel calls (s = 16 d, z = 0 on h; s = d, z = 8 d on l). Rounding d to
bfloat16 scales both terms alike: the kernel then sees exactly bf16(d) * q.

With few rows (a decode step) the kernel reads 4-bit weights: ~8x fewer bytes than float32.
With many rows it dequantizes the weights again for every 4 rows, so there dense weights are
faster: `CpuLinear` keeps both and picks by the row count.

Dense bfloat16 weights are kept in oneDNN's own blocked layout (`pack_bf16`): `F.linear`
reorders a plain weight into that layout on every call, which on an AMX CPU costs more than
the matmul itself (30 layers of SmolLM2's projections, weights streamed from memory, 2
threads: 16.4 ms at 8 rows plain vs 10.8 ms packed, 21.8 vs 13.6 ms at 40 rows, 160 vs 77 ms
at 512 rows). The packed product is the plain bfloat16 one bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from kspec.engine.models.tensor_file import TensorFile

GROUP = 32  # weights per GGUF Q4 block = the kernel's group size


def check_code_shapes(codes: Tensor, form: str, params: Mapping[str, Tensor], weights_per_param: int) -> None:
    """codes [N, K] with K a multiple of 32, each of `params` [N, K / weights_per_param]."""
    n, k = codes.shape
    if k % GROUP:
        raise ValueError(f"{form} weights need K divisible by {GROUP}, got K={k}")
    for name, values in params.items():
        if values.shape != (n, k // weights_per_param):
            raise ValueError(f"{name} must be [{n}, {k // weights_per_param}], got {tuple(values.shape)}")


@dataclass(frozen=True)
class Q4Codes:
    """One weight matrix [N, K] in groups of 32 along K: w = (q - 8) * scale + zero."""

    codes: Tensor  # [N, K] uint8, 0..15
    scale: Tensor  # [N, K/32] float32
    zero: Tensor  # [N, K/32] float32

    def __post_init__(self) -> None:
        check_code_shapes(self.codes, "4-bit", {"scale": self.scale, "zero": self.zero}, GROUP)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def dequantize(self) -> Tensor:
        """[N, K] float32, as the kernel sees the weights with float32 group parameters."""
        n, k = self.shape
        q = self.codes.to(torch.float32).view(n, k // GROUP, GROUP) - 8  # [N, K/32, 32]
        return (q * self.scale[..., None] + self.zero[..., None]).view(n, k)

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


def pack_nibbles(codes: Tensor) -> Tensor:
    """4-bit codes [N, K] (uint8, 0..15) -> [N, K/2] uint8, two a byte, the lower-indexed one
    in the low nibble (how a `save_q4` file and `Int4Embedding` hold them)."""
    pairs = codes.view(codes.shape[0], -1, 2)  # [N, K/2, 2]
    return (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()


def unpack_nibbles(nibbles: Tensor) -> Tensor:
    """[..., K/2] uint8 from `pack_nibbles` -> the codes [..., K]."""
    codes = torch.empty(*nibbles.shape, 2, dtype=torch.uint8)  # [..., K/2, 2]
    torch.bitwise_and(nibbles, 0x0F, out=codes[..., 0])
    torch.bitwise_right_shift(nibbles, 4, out=codes[..., 1])
    return codes.view(*nibbles.shape[:-1], -1)


TERM_SEPARATOR = "#"  # "<weight>#hi" / "<weight>#lo": a weight stored as two 4-bit terms (8-bit codes)
SIX_BIT_PART = "q6"  # "<weight>#q6": a weight stored as 6-bit codes (`SixBitCodes`: a GGUF Q6_K weight)


def six_bit_name(name: str) -> str:
    return f"{name}{TERM_SEPARATOR}{SIX_BIT_PART}"


def term_names(codes: Mapping[str, object], name: str) -> list[str] | None:
    """The names of the 4-bit terms whose sum is weight `name` (one for the 4-bit form, two for
    the 8-bit one: gguf_blocks.py), else None."""
    names = [name] if name in codes else [f"{name}{TERM_SEPARATOR}{part}" for part in ("hi", "lo")]
    return names if all(part in codes for part in names) else None


def weight_terms(codes: Mapping[str, "Q4Codes | SixBitCodes"], name: str) -> list[Q4Codes] | None:
    """The 4-bit terms whose sum is weight `name` (a 6-bit weight requantized to the 8-bit form's
    two), else None."""
    names = term_names(codes, name)
    if names is None:
        six = six_bit_codes(codes, name)
        return None if six is None else six.eight_bit()
    return [codes[part] for part in names]  # type: ignore[misc]


def six_bit_codes(codes: Mapping[str, "Q4Codes | SixBitCodes"], name: str) -> "SixBitCodes | None":
    """Weight `name`'s 6-bit codes where it is stored so, else None."""
    found = codes.get(six_bit_name(name))
    return found if isinstance(found, SixBitCodes) else None


@dataclass(frozen=True)
class PackedCodes:
    """One 4-bit matrix as a `save_q4` file stores it: codes two a byte [N, K/2] uint8 (low
    nibble first), scale and zero [N, K/32]."""

    codes: Tensor
    scale: Tensor
    zero: Tensor

    @classmethod
    def of(cls, q4: Q4Codes) -> "PackedCodes":
        return cls(pack_nibbles(q4.codes), q4.scale.contiguous(), q4.zero.contiguous())

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], 2 * self.codes.shape[1])


def packed_terms(codes: Mapping[str, Q4Codes], name: str) -> list[PackedCodes] | None:
    """`weight_terms` as stored: mapped from a `Q4File` (nothing read), packed otherwise."""
    names = term_names(codes, name)
    if names is None:
        six = six_bit_codes(codes, name)  # requantized to the 8-bit form's two terms, in memory
        return None if six is None else [PackedCodes.of(term) for term in six.eight_bit()]
    return [codes.packed(part) if isinstance(codes, Q4File) else PackedCodes.of(codes[part]) for part in names]


Q4_FILE = "q4.safetensors"  # next to a converted GGUF's model.safetensors: its 4-bit weights as stored
Q4_FORMAT = "kspec-q4-v4"  # v2: Q8_0 weights as two terms; v3: every GGUF type (gguf_blocks.py); v4: Q6_K as 6-bit codes; an older file is written again


def q4_tensors(name: str, q4: "Q4Codes | SixBitCodes") -> dict[str, Tensor]:
    """One term as a `save_q4` file stores it: codes two a byte (low nibble first), scale, zero
    (a 6-bit weight: `six_bit_tensors`)."""
    if isinstance(q4, SixBitCodes):
        return six_bit_tensors(name, q4)
    packed = PackedCodes.of(q4)
    return {f"{name}.codes": packed.codes, f"{name}.scale": packed.scale, f"{name}.zero": packed.zero}


def six_bit_tensors(name: str, six: "SixBitCodes") -> dict[str, Tensor]:
    """One 6-bit weight as a `save_q4` file stores it: the codes' low 4 bits two a byte (as a
    4-bit term's), their high 2 bits four a byte (lower-indexed weight in the lower bits), the scales."""
    n, k = six.shape
    high = (six.codes >> 4).view(n, k // 4, 4)  # [N, K/4, 4]
    packed_high = high[..., 0] | (high[..., 1] << 2) | (high[..., 2] << 4) | (high[..., 3] << 6)
    return {f"{name}.codes": pack_nibbles(six.codes & 0x0F), f"{name}.high": packed_high.contiguous(), f"{name}.scale": six.scale.contiguous()}


def _six_bit_from(low: Tensor, packed_high: Tensor, scale: Tensor) -> "SixBitCodes":
    """`six_bit_tensors`' parts -> the weight."""
    high = torch.stack([(packed_high >> shift) & 3 for shift in (0, 2, 4, 6)], dim=-1).flatten(-2)  # [N, K]
    return SixBitCodes(unpack_nibbles(low) | (high << 4), scale)


def save_q4(codes: Mapping[str, "Q4Codes | SixBitCodes"], path: Path) -> None:
    """Write 4-bit weights compactly (two codes a byte, low nibble first) to a safetensors file."""
    tensors: dict[str, Tensor] = {}
    for name, q4 in codes.items():
        tensors.update(q4_tensors(name, q4))
    save_q4_tensors(tensors, path)


def save_q4_tensors(tensors: Mapping[str, Tensor], path: Path, **metadata: str) -> None:
    """Write `q4_tensors` output (of every term) as a `save_q4` file."""
    save_file(dict(tensors), str(path), metadata={"format": Q4_FORMAT, "group": str(GROUP), **metadata})


def load_q4(path: Path) -> dict[str, Q4Codes]:
    """Every weight `save_q4` wrote, by name (see Q4File to read them one at a time)."""
    with Q4File(path) as q4:
        return {name: q4[name] for name in q4}


class Q4File(Mapping[str, Q4Codes]):
    """The weights of a `save_q4` file, each read when asked for (a model converts one layer at
    a time without holding every layer's unpacked codes). Use as a context manager."""

    def __init__(self, path: Path):
        self.path = path
        self._file = TensorFile(path)
        self._names = sorted({key.rsplit(".", 1)[0] for key in self._file.names()})
        self._known = frozenset(self._names)
        self.format = self._file.metadata.get("format", "")

    def __enter__(self) -> "Q4File":
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.__exit__()

    def __contains__(self, name: object) -> bool:
        return name in self._known  # Mapping's own would read and unpack the weight

    def __getitem__(self, name: str) -> Q4Codes:
        if name not in self._known:
            raise KeyError(name)
        if name.endswith(f"{TERM_SEPARATOR}{SIX_BIT_PART}"):
            return _six_bit_from(*(self._file.get(f"{name}.{part}") for part in ("codes", "high", "scale")))  # type: ignore[return-value]
        codes = unpack_nibbles(self._file.get(f"{name}.codes"))  # [N, K/2] -> [N, K]
        return Q4Codes(codes, self._file.get(f"{name}.scale"), self._file.get(f"{name}.zero"))

    def packed(self, name: str) -> "PackedCodes":
        """A weight as the file stores it, mapped, not read (`TensorFile.mapped`): a table looked
        up a few rows at a time keeps only those rows' pages resident."""
        if name not in self._known:
            raise KeyError(name)
        return PackedCodes(*(self._file.mapped(f"{name}.{part}") for part in ("codes", "scale", "zero")))

    def shape(self, name: str) -> tuple[int, int]:
        """A weight's [N, K], from the file's header: nothing read."""
        rows, half = self._file.shape(f"{name}.codes")
        return rows, 2 * half

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def weight_shape(codes: Mapping[str, Q4Codes], name: str) -> tuple[int, int]:
    """[N, K] of a weight's term, without reading it where the codes are a file."""
    return codes.shape(name) if isinstance(codes, Q4File) else codes[name].shape


def cat_rows(parts: Sequence[Q4Codes]) -> Q4Codes:
    """Stack matrices with the same K along N (a fused projection)."""
    return Q4Codes(
        torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]), torch.cat([p.zero for p in parts])
    )


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


Q4Q8Matmul = Callable[[Tensor, Tensor, Tensor], Tensor]  # kernels/cpu_layers.py load_matmul: x, codes, params -> y
Q4Q8_TILE = 16  # weight rows (outputs) the kernel stores interleaved, one per lane (csrc/q4_q8_matmul.cpp)


def symmetric_zero(bits: int) -> float:
    """m / s of a symmetric weight in the `bits`-bit form (Q4_0, Q5_0, Q8_0: codes centred on
    2^(bits - 1)), which the kernel implies where params hold s alone (csrc/q4q8/layout.h kSymmetricZero)."""
    return -float(1 << (bits - 1))


class TiledTerm(nn.Module):
    """A matrix for kspec's kernel (csrc/q4_q8_matmul.cpp), in tiles of 16 weight rows:
    x [M, K] -> x W^T [M, N] float32, the activations quantized to 8 bits per block of 32 by the
    kernel. Holds the form's codes and its float16 parameters [N/16, K/32, 2, 16] (a block's s
    of the tile's outputs, then their m), or [N/16, K/32, 1, 16] where every m is
    symmetric_zero(bits) s (a symmetric weight: the file's own bytes); the subclasses lay out the codes."""

    bits: int  # a weight's code: 4, 5, 6 or 8

    def __init__(self, codes: Tensor, scale: Tensor, minimum: Tensor, out_features: int, matmul: Q4Q8Matmul):
        """codes in the form's layout; scale, minimum [N padded, K/32] float32."""
        super().__init__()
        rows, blocks = scale.shape
        exact = torch.stack([scale, minimum], dim=1).float()  # [N, 2, K/32]
        params = exact.to(torch.float16)
        pairs = params.view(rows // Q4Q8_TILE, Q4Q8_TILE, 2, blocks).permute(0, 3, 2, 1)  # [N/16, K/32, 2, 16]
        symmetric = self.bits != 6 and torch.equal(pairs[:, :, 1].float(), symmetric_zero(self.bits) * pairs[:, :, 0].float())
        self._hold(codes, (pairs[:, :, :1] if symmetric else pairs).contiguous(), out_features, matmul)
        self.exact_params = bool(torch.equal(params.float(), exact))  # float16 held every s and m as given

    def _hold(self, codes: Tensor, params: Tensor, out_features: int, matmul: Q4Q8Matmul) -> None:
        self.exact_params = False  # not known of a term mapped from a store
        self.matmul = matmul
        self.out_features = out_features
        self.codes: Tensor
        self.params: Tensor
        self.register_buffer("codes", codes)
        self.register_buffer("params", params)

    @classmethod
    def from_layout(cls, codes: Tensor, params: Tensor, out_features: int, matmul: Q4Q8Matmul) -> "TiledTerm":
        """A term from its form's layout as an earlier one held it (`codes`, `params` [N/16, K/32,
        2, 16]): no conversion (engine/models/tiled_store.py)."""
        term = cls.__new__(cls)
        nn.Module.__init__(term)
        term._hold(codes, params, out_features, matmul)
        return term

    @property
    def in_features(self) -> int:
        return self.codes.shape[1] * GROUP

    @property
    def nbytes(self) -> int:
        """Bytes a matmul reads of the weights."""
        return self.codes.nbytes + self.params.nbytes

    def forward(self, x: Tensor) -> Tensor:
        y = self.matmul(x.float(), self.codes, self.params)  # [M, N padded]
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]


class Q4Q8Term(TiledTerm):
    """One 4-bit matrix for kspec's 4-bit x 8-bit kernel (x quantized to 8 bits per block of 32,
    as llama.cpp does, where PyTorch's int4 kernel is slow: AVX2). The file's codes as they are;
    s = scale and m = zero - 8 scale in float16 (a GGUF's own d and m). Rows are padded to a
    multiple of 16."""

    bits = 4  # a weight's code

    def __init__(self, codes: Q4Codes, matmul: Q4Q8Matmul):
        per_block, scale, zero = _tile_blocks(codes.codes, codes.scale, codes.zero, 0)  # [N/16, 16, K/32, 32]
        super().__init__(_bit_planes_layout(per_block, 4), scale, zero - 8 * scale, codes.shape[0], matmul)


EIGHT_BIT_ZERO_SHIFT = 136  # (h - 8) 16 s + (l - 8) s = s u - 136 s: the low term's zero is m + 136 s


def eight_bit_terms(codes: Tensor, scale: Tensor, minimum: Tensor) -> list[Q4Codes]:
    """w = s u + m (u [N, K] uint8, s and m [N, K/32] float32) as two 4-bit terms, the high and
    low nibbles of u, whose sum is w: s u = 16 s h + s l."""
    s, m = scale.float().contiguous(), minimum.float()
    high = Q4Codes((codes >> 4).contiguous(), 16 * s, torch.zeros_like(s))
    low = Q4Codes((codes & 0x0F).contiguous(), s, m + EIGHT_BIT_ZERO_SHIFT * s)
    return [high, low]


def as_eight_bit(terms: Sequence[Q4Codes]) -> list[Q4Codes]:
    """A weight's terms in the 8-bit form (two terms), exactly: a 4-bit term w = (q - 8) S + Z is
    u = q, s = S, m = Z - 8 S."""
    if len(terms) == 2:
        return list(terms)
    (term,) = terms
    return eight_bit_terms(term.codes, term.scale, term.zero - 8 * term.scale.float())


def eight_bit_codes(terms: Sequence[Q4Codes]) -> tuple[Tensor, Tensor, Tensor] | None:
    """An 8-bit weight's two 4-bit terms (gguf_blocks.eight_bit_terms: high and low nibbles of
    u) joined back: (u [N, K] uint8, s, m [N, K/32] float32) with w = s u + m; None for any other
    terms."""
    if len(terms) != 2 or terms[0].shape != terms[1].shape:
        return None
    high, low = terms
    s = low.scale
    if not (torch.equal(high.zero, torch.zeros_like(s)) and torch.equal(high.scale, 16 * s)):
        return None
    return high.codes * 16 + low.codes, s, low.zero - EIGHT_BIT_ZERO_SHIFT * s


class Q8Q8Term(TiledTerm):
    """One 8-bit matrix (w = s u + m, u in 0..255: a GGUF Q8_0 weight has u = q + 128, s = d,
    m = -128 d; Q5_x / Q6_K ones: gguf_blocks.py) for the kernel's 8-bit form (q8_q8_matmul:
    llama.cpp's Q8_0 x Q8_0 dot), one integer dot per block where the two 4-bit terms of the same
    weight take two. s and m in float16. Rows are padded to a multiple of 16."""

    bits = 8  # a weight's code

    def __init__(self, codes: Tensor, scale: Tensor, minimum: Tensor, matmul: Q4Q8Matmul):
        per_block, scale, minimum = _tile_blocks(codes, scale, minimum, 128)  # [N/16, 16, K/32, 32]
        fours = per_block.unflatten(-1, (GROUP // 4, 4))  # [N/16, 16, K/32, 8, 4]
        layout = fours.permute(0, 2, 3, 1, 4).contiguous()  # [N/16, K/32, 8, 16, 4] uint8
        super().__init__(layout, scale, minimum, codes.shape[0], matmul)


def _tile_blocks(codes: Tensor, scale: Tensor, minimum: Tensor, pad_code: int) -> tuple[Tensor, Tensor, Tensor]:
    """codes [N, K] -> [N/16, 16, K/32, 32] and scale, minimum [N padded, K/32]: rows padded to a
    multiple of 16 with `pad_code` and s = m = 0 (zero weights)."""
    n, k = codes.shape
    padded = -n % Q4Q8_TILE
    scale, minimum = scale.float(), minimum.float()
    if padded:
        codes = torch.cat([codes, codes.new_full((padded, k), pad_code)])
        scale, minimum = (torch.cat([t, t.new_zeros(padded, k // GROUP)]) for t in (scale, minimum))
    return codes.view((n + padded) // Q4Q8_TILE, Q4Q8_TILE, k // GROUP, GROUP), scale, minimum


def _bit_planes_layout(per_block: Tensor, bits: int) -> Tensor:
    """Codes [N/16, 16, K/32, 32] below 2^bits (4, 5 or 6) -> the 4/5/6-bit forms' layout [N/16,
    K/32, bits, 16, 4]: the low 4 bits as a GGUF block's bytes (weight j low, j + 16 high), register
    p each output's bytes 4p .. 4p + 3; then for each higher bit a 64-byte register whose byte
    4 n + i holds in bit j that bit of output n's weight 4j + i (csrc/q4q8/layout.h high_bits)."""
    tiles, _, blocks, _ = per_block.shape
    low = per_block & 0x0F
    nibbles = low[..., :16] | (low[..., 16:] << 4)  # weight j low, j + 16 high (GGUF's bytes)
    registers = [nibbles.view(tiles, Q4Q8_TILE, blocks, 4, 4).permute(0, 2, 3, 1, 4)]  # [N/16, K/32, 4, 16, 4]
    weights = (1 << torch.arange(8, dtype=torch.uint8)).view(1, 1, 1, 1, 8)  # bit j
    for plane in range(4, bits):
        bit = ((per_block >> plane) & 1).view(tiles, Q4Q8_TILE, blocks, 8, 4).permute(0, 2, 1, 4, 3)  # [N/16, K/32, 16 (n), 4 (i), 8 (j)]
        registers.append((bit * weights).sum(-1, dtype=torch.uint8).view(tiles, blocks, 1, Q4Q8_TILE, 4))  # 64 bytes a block
    return torch.cat(registers, dim=2).contiguous()


class Q5Q8Term(TiledTerm):
    """One matrix of 5-bit codes (w = s u + m, u in 0..31: GGUF Q5_0 / Q5_1 / Q5_K weights) for
    the kernel's 5-bit form (q5_q8_matmul): the 8-bit form's arithmetic over 5 bits a weight (its
    codes' low 4 bits laid out as Q4Q8Term's, then for each block a 64-byte register whose byte
    4 n + i holds in bit j the fifth bit of output n's weight 4j + i). Rows are padded to a
    multiple of 16."""

    bits = 5  # a weight's code

    def __init__(self, codes: Tensor, scale: Tensor, minimum: Tensor, matmul: Q4Q8Matmul):
        if int(codes.max()) > 31:
            raise ValueError("5-bit codes must be in 0..31")
        per_block, scale, minimum = _tile_blocks(codes, scale, minimum, 0)
        super().__init__(_bit_planes_layout(per_block, 5), scale, minimum, codes.shape[0], matmul)


SIX_BIT_ZERO = 32  # a 6-bit code's zero: w = s (u - 32) (csrc/q4q8/layout.h kSixBitZero)
HALF = GROUP // 2  # weights per 6-bit scale


@dataclass(frozen=True)
class SixBitCodes:
    """One weight matrix [N, K] with a scale per 16 weights along K: w = scale (u - 32), u in
    0..63 (a GGUF Q6_K weight's own codes, scale = d sc)."""

    codes: Tensor  # [N, K] uint8, 0..63
    scale: Tensor  # [N, K/16] float32

    def __post_init__(self) -> None:
        check_code_shapes(self.codes, "6-bit", {"scale": self.scale}, HALF)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def dequantize(self) -> Tensor:
        """[N, K] float32."""
        n, k = self.shape
        u = self.codes.to(torch.float32).view(n, k // HALF, HALF) - SIX_BIT_ZERO  # [N, K/16, 16]
        return (u * self.scale.float()[..., None]).view(n, k)

    def eight_bit(self) -> list[Q4Codes]:
        """The weight requantized to the 8-bit form (two 4-bit terms) for a kernel without the
        6-bit one: per block of 32, |error| <= 1/254 of the block's largest weight."""
        return requantized_8bit(self.dequantize())

    def permute_rows(self, order: Tensor) -> "SixBitCodes":
        return SixBitCodes(self.codes[order], self.scale[order])


def requantized_8bit(weight: Tensor) -> list[Q4Codes]:
    """A float matrix [N, K] as Q8_0 does it, per block of 32: d = max |w| / 127, q = round(w / d),
    as the 8-bit form's two terms."""
    rows = weight.shape[0]
    groups = weight.float().reshape(rows, -1, GROUP)  # [N, K/32, 32]
    d = groups.abs().amax(-1) / 127  # [N, K/32]
    safe = torch.where(d > 0, d, torch.ones_like(d))
    u = (torch.round(groups / safe[..., None]).clamp(-127, 127) + 128).to(torch.uint8)
    return eight_bit_terms(u.reshape(rows, -1), d, -128 * d)


def cat_six_bit(parts: Sequence[SixBitCodes]) -> SixBitCodes:
    """Stack 6-bit matrices with the same K along N (a fused projection)."""
    return SixBitCodes(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]))


class Q6Q8Term(TiledTerm):
    """One matrix of 6-bit codes (`SixBitCodes`: a GGUF Q6_K weight, exactly) for the kernel's
    6-bit form (q6_q8_matmul): codes laid out as Q5Q8Term's with a second register for the sixth
    bits, and each block's two scales (weights 0 .. 15, 16 .. 31) in the s and m slots of
    the params. Rows are padded to a multiple of 16."""

    bits = 6  # a weight's code

    def __init__(self, six: SixBitCodes, matmul: Q4Q8Matmul):
        n, k = six.shape
        halves = six.scale.float().view(n, k // GROUP, 2)  # [N, K/32, 2]
        per_block, first, second = _tile_blocks(six.codes, halves[..., 0], halves[..., 1], SIX_BIT_ZERO)
        super().__init__(_bit_planes_layout(per_block, 6), first, second, n, matmul)


class Int4Term(nn.Module):
    """One 4-bit matrix in the kernel's layout: x [M, K] -> x W^T [M, N] in the kernel's dtype."""

    def __init__(self, codes: Q4Codes, dtype: torch.dtype):
        super().__init__()
        self.packed: Tensor
        self.scales_zeros: Tensor
        packed, scales_zeros = _pack(codes, dtype)
        self.register_buffer("packed", packed)  # [N, K/2] uint8
        self.register_buffer("scales_zeros", scales_zeros)  # [K/32, N, 2]

    @property
    def nbytes(self) -> int:
        """Bytes a matmul reads of the weights."""
        return self.packed.nbytes + self.scales_zeros.nbytes

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)


def packing_available() -> bool:
    """Whether this PyTorch and CPU can keep bfloat16 weights in oneDNN's layout (`pack_bf16`):
    oneDNN's bfloat16 path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT."""
    return (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )  # fmt: skip


def pack_bf16(weight: Tensor) -> Tensor:
    """A [N, K] weight as a bfloat16 oneDNN tensor for `packed_linear` (a copy in its layout)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous())


def packed_linear(x: Tensor, packed: Tensor) -> Tensor:
    """x [..., K] (bfloat16) -> x W^T [..., N] in bfloat16, W from `pack_bf16`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class DenseWeightsSkipped(RuntimeError):
    """A CpuLinear needs a dense weight that the loader skipped for its codes (loading.py reads
    every weight then)."""


class CpuLinear(nn.Module):
    """y = x W^T (+ b) from 4-bit terms (rows <= int4_max_rows) or dense weights, for any x dtype.

    The 4-bit kernel computes in bfloat16 (x is cast in; two terms of a Q8_0 weight are summed).
    The dense form is a list of parts whose outputs are concatenated (a fused projection keeps
    its q, k and v weights as loaded: no copy), in `dense_dtype` (float32 where the CPU has no
    native bfloat16: emulated bfloat16 matmuls are slower than float32 ones there). In bfloat16
    the parts are one weight in oneDNN's layout instead (`pack_bf16`, where available): one
    matmul, no reorder per call. Either form may be absent: without terms the dense form serves
    every call; without it the 4-bit kernel does (slower for many rows, smaller in memory).
    With `q8q8_matmul` (kspec's kernel's 8-bit form) a Q8_0 weight's two 4-bit terms are one
    8-bit term (`Q8Q8Term`): the same bytes, one integer dot per block instead of two; with
    `q5q8_matmul` too, codes that fit 5 bits (Q5_0 / Q5_1 / Q5_K) are one 5-bit term (`Q5Q8Term`)."""

    def __init__(
        self,
        dense: Sequence[Tensor],
        terms: Sequence[Q4Codes],
        bias: Tensor | None,
        int4_max_rows: int,
        dense_dtype: torch.dtype = torch.float32,
        int4_dtype: torch.dtype = torch.bfloat16,
        q4q8_matmul: Q4Q8Matmul | None = None,
        q8q8_matmul: Q4Q8Matmul | None = None,
        q5q8_matmul: Q4Q8Matmul | None = None,
        tiled: Sequence[TiledTerm] = (),
    ):
        """`tiled`: terms for kspec's kernel as an earlier load built them (instead of `terms`)."""
        super().__init__()
        if not dense and not terms and not tiled:
            raise ValueError("a linear layer needs dense weights or 4-bit codes")
        if any(w.is_meta for w in dense):
            raise DenseWeightsSkipped("a dense weight was not read (its codes could not serve alone)")
        in_features = {t.shape[1] for t in terms} | {w.shape[1] for w in dense} | {t.in_features for t in tiled}
        out_features = {t.shape[0] for t in terms} | ({sum(w.shape[0] for w in dense)} if dense else set()) | {t.out_features for t in tiled}
        if len(in_features) != 1 or len(out_features) != 1:
            raise ValueError(f"4-bit terms and dense parts disagree on the shape: K {in_features}, N {out_features}")
        self.in_features, self.out_features = in_features.pop(), out_features.pop()
        self.int4_max_rows = int4_max_rows
        # the 4-bit terms' kernel: kspec's 4-bit x 8-bit one where given (float32 in and out),
        # else PyTorch's int4 kernel (in int4_dtype: bfloat16 is its vectorized path)
        self.int4_dtype = torch.float32 if q4q8_matmul is not None or tiled else int4_dtype
        eight_bit = eight_bit_codes(terms) if q4q8_matmul is not None and q8q8_matmul is not None else None
        if tiled:
            self.terms = nn.ModuleList(tiled)
        elif eight_bit is not None and q5q8_matmul is not None and int(eight_bit[0].max()) <= 31:
            self.terms = nn.ModuleList([Q5Q8Term(*eight_bit, q5q8_matmul)])  # 5-bit codes: 5 bits a weight, not 8
        elif eight_bit is not None:
            self.terms = nn.ModuleList([Q8Q8Term(*eight_bit, q8q8_matmul)])  # type: ignore[arg-type]
        else:
            self.terms = nn.ModuleList(
                Q4Q8Term(t, q4q8_matmul) if q4q8_matmul is not None else Int4Term(t, self.int4_dtype) for t in terms
            )
        # oneDNN's layout: not a buffer (state_dict and .to() know no such tensors); CPU only.
        self.packed: Tensor | None = None
        if dense and dense_dtype == torch.bfloat16 and packing_available():
            self.packed = pack_bf16(torch.cat([w.detach().to(torch.bfloat16) for w in dense]) if len(dense) > 1 else dense[0])
            dense = []
        self.dense_names = tuple(f"dense{i}" for i in range(len(dense)))
        for name, weight in zip(self.dense_names, dense):  # same storage when already in dense_dtype
            self.register_buffer(name, weight.detach().to(dense_dtype).contiguous())
        self.bias: Tensor | None
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    @property
    def has_int4(self) -> bool:
        return len(self.terms) > 0

    @property
    def has_dense(self) -> bool:
        return self.packed is not None or bool(self.dense_names)

    @property
    def dense_dtype(self) -> torch.dtype | None:
        if self.packed is not None:
            return torch.bfloat16
        return self.dense_parts[0].dtype if self.dense_names else None

    @property
    def dense_nbytes(self) -> int:
        """Bytes of the dense form (read once by a matmul that uses it)."""
        if self.packed is not None:
            return self.out_features * self.in_features * torch.bfloat16.itemsize
        return sum(w.nbytes for w in self.dense_parts)

    @property
    def dense_parts(self) -> list[Tensor]:
        """The dense weights in plain layout (none when packed)."""
        return [getattr(self, name) for name in self.dense_names]

    def uses_int4(self, rows: int) -> bool:
        """Whether a matmul of this many rows takes the 4-bit terms (else the dense form)."""
        return self.has_int4 and (not self.has_dense or rows <= self.int4_max_rows)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in the dtype it was computed in (bfloat16 from the 4-bit kernel):
        no cast back, the caller's next op promotes (a float32 residual add, rotary with float32
        cos/sin) or takes it as is (the next projection)."""
        rows = x.numel() // self.in_features
        if self.uses_int4(rows):
            flat = x.reshape(rows, self.in_features).to(self.int4_dtype)  # [M, K]
            terms = iter(self.terms)  # not self.terms[1:]: slicing builds a new ModuleList per call
            out = next(terms)(flat)  # [M, N]
            for term in terms:  # a Q8_0 weight's second term: summed in float32
                out = out.float() + term(flat)
            out = out.view(*x.shape[:-1], self.out_features)
        elif self.packed is not None:
            out = packed_linear(x.to(torch.bfloat16), self.packed)
        else:
            parts = self.dense_parts
            x = x.to(parts[0].dtype)
            out = F.linear(x, parts[0]) if len(parts) == 1 else torch.cat([F.linear(x, w) for w in parts], dim=-1)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        forms = []
        if self.terms:
            forms.append(f"{len(self.terms)} int4 term(s) up to {self.int4_max_rows} rows")
        if self.packed is not None:
            forms.append("dense bfloat16 (oneDNN layout)")
        elif self.dense_names:
            forms.append(f"{len(self.dense_names)} dense part(s) {str(self.dense_parts[0].dtype).removeprefix('torch.')}")
        return f"{self.in_features} -> {self.out_features}, {' + '.join(forms)}"


class Int4Embedding(nn.Module):
    """An embedding table kept as its 4-bit terms (a Q8_0 or Q5 table: two), dequantized per
    looked-up row.

    Each term holds its codes two a byte ([V, D/2] uint8, low nibble first) and its group
    parameters ([V, D/32] each) as the converted file stores them (`PackedCodes`; mapped from the
    file at load, so only the rows looked up become resident), and a row comes back as the file's
    float32 weights exactly: every term's (q - 8) * s + z and their sum are multiples of the
    block's scale far below 2^24 of them (tests/unit/models/test_fast_path.py checks it)."""

    def __init__(self, terms: Sequence[PackedCodes], dtype: torch.dtype = torch.float32):
        super().__init__()
        if not terms or len({t.shape for t in terms}) != 1:
            raise ValueError("an embedding needs one or more 4-bit terms of one shape")
        self.num_embeddings, self.embedding_dim = terms[0].shape
        self.dtype = dtype
        for index, term in enumerate(terms):
            self.register_buffer(f"codes{index}", term.codes)  # [V, D/2]
            self.register_buffer(f"scale{index}", term.scale)  # [V, D/32]
            self.register_buffer(f"zero{index}", term.zero)  # [V, D/32]
        self.n_terms = len(terms)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [...] -> [..., D] in self.dtype."""
        flat = tokens.reshape(-1)  # [M]
        rows = flat.numel()
        out: Tensor | None = None
        for index in range(self.n_terms):
            codes = unpack_nibbles(getattr(self, f"codes{index}")[flat]).view(rows, -1, GROUP)  # [M, D/32, 32]
            scale, zero = getattr(self, f"scale{index}")[flat].float(), getattr(self, f"zero{index}")[flat].float()  # [M, D/32]
            term = (codes.float() - 8) * scale[..., None] + zero[..., None]  # [M, D/32, 32]
            out = term if out is None else out + term
        assert out is not None
        return out.view(*tokens.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.n_terms} int4 term(s)"


class TiledEmbedding(nn.Module):
    """An embedding table looked up in kspec's kernel forms (`TiledTerm`s, their sum): a head's own
    codes where the table is tied to it (no table of its own), else the table's own form, kept with
    the other forms on disk (tiled_store.py; mapped, so only the rows looked up become resident).
    A row is decoded from its tile's lane: the 8-bit form's bytes, or the 4/5/6-bit forms' nibbles and
    bit planes, then s u + m (the 6-bit form: s of its half block times u - 32). Each weight is what
    the kernel multiplies: the file's own for Q8_0 and Q4/Q5 (their d, m are float16), d sc rounded
    to float16 for the K-types."""

    def __init__(self, terms: Sequence[TiledTerm], dtype: torch.dtype = torch.float32):
        super().__init__()
        if not terms or len({(t.out_features, t.in_features) for t in terms}) != 1:
            raise ValueError("an embedding needs one or more kernel forms of one shape")
        self.terms = nn.ModuleList(terms)  # a tied head's own modules: their buffers counted once
        self.num_embeddings, self.embedding_dim = terms[0].out_features, terms[0].in_features
        self.dtype = dtype

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [...] -> [..., D] in self.dtype."""
        flat = tokens.reshape(-1)  # [M]
        out = sum(tiled_rows(term, flat) for term in self.terms)  # [M, D]
        return out.view(*tokens.shape, self.embedding_dim).to(self.dtype)  # type: ignore[union-attr]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {' + '.join(type(t).__name__ for t in self.terms)}"


def tiled_rows(term: TiledTerm, rows: Tensor) -> Tensor:
    """Weight rows `rows` [M] of a kernel form as float32 [M, K]."""
    tile, lane = rows // Q4Q8_TILE, rows % Q4Q8_TILE
    params = term.params[tile, :, :, lane].float()  # [M, K/32, 2]: s, m (6-bit: s of each half block), or [M, K/32, 1]: s
    if params.shape[-1] == 1:  # a symmetric form's m
        params = torch.cat([params, symmetric_zero(term.bits) * params], dim=-1)
    if isinstance(term, Q8Q8Term):
        u = term.codes[tile, :, :, lane, :].reshape(len(rows), -1, GROUP).float()  # [M, K/32, 32]: register j holds weights 4j ..
        return (u * params[..., 0:1] + params[..., 1:2]).flatten(1)
    nibbles = term.codes[tile, :, :4, lane, :]  # [M, K/32, 4 (p), 4 (i)]: weight 4p + i low, 16 + 4p + i high
    u = torch.cat([(nibbles & 0x0F).flatten(2), (nibbles >> 4).flatten(2)], dim=-1).to(torch.int32)  # [M, K/32, 32]
    for plane in range(4, term.bits):  # the nibble registers, then one register per higher bit
        bits = term.codes[tile, :, plane, lane, :].to(torch.int32)  # [M, K/32, 4 (i)]: bit j that of weight 4j + i
        plane_bits = (bits.unsqueeze(-2) >> torch.arange(8).view(8, 1)) & 1  # [M, K/32, 8 (j), 4 (i)]
        u += plane_bits.flatten(2) << plane
    if isinstance(term, Q6Q8Term):
        halves = (u.float() - SIX_BIT_ZERO).view(len(rows), -1, 2, HALF)  # [M, K/32, 2, 16]
        return (halves * params[..., None]).flatten(1)
    return (u.float() * params[..., 0:1] + params[..., 1:2]).flatten(1)


PACK_ROWS = 4096  # rows packed at a time: the kernel's layout is blocked by 64 (AVX-512) or 32 rows


def _pack(codes: Q4Codes, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """-> packed [N, K/2] uint8, scales_zeros [K/32, N, 2] in dtype. The packing op wants int32
    codes (4 bytes a weight): a 49152-row head is packed in blocks, whose layouts concatenate."""
    convert = torch.ops.aten._convert_weight_to_int4pack_for_cpu
    blocks = codes.codes.split(PACK_ROWS)  # each [<= PACK_ROWS, K]
    packed = torch.cat([convert(block.to(torch.int32), 1) for block in blocks]) if len(blocks) > 1 else convert(codes.codes.to(torch.int32), 1)
    scales_zeros = torch.stack([codes.scale.t(), codes.zero.t()], dim=-1).to(dtype).contiguous()  # [K/32, N, 2]
    return packed, scales_zeros


def fused_linear(
    linears: Sequence[nn.Linear],
    terms: Sequence[list[Q4Codes] | None],
    int4_max_rows: int,
    dense_dtype: torch.dtype,
    keep_dense: bool = True,
    q4q8_matmul: Q4Q8Matmul | None = None,
    q8q8_matmul: Q4Q8Matmul | None = None,
    q5q8_matmul: Q4Q8Matmul | None = None,
    tiled: Sequence[TiledTerm] = (),
) -> CpuLinear:
    """One CpuLinear for several linear layers over the same input (outputs concatenated), with
    each part's terms (`weight_terms`), or the fused terms an earlier load built (`tiled`). On the
    kernels only when every part has them (parts in both forms all take the 8-bit one: a Q4_K q
    and k beside a Q6_K v); the dense parts are kept unless keep_dense is False."""
    biases = [linear.bias for linear in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(l.out_features) for b, l in zip(biases, linears)]
    )
    fused: list[Q4Codes] = []
    if tiled:
        dense = [linear.weight for linear in linears] if keep_dense else []
        return CpuLinear(dense, [], bias, int4_max_rows, dense_dtype, tiled=tiled)
    if int4_kernel_available() and all(t is not None for t in terms):
        parts = [t for t in terms if t is not None]
        if len(parts) > 1 and any(len(t) == 2 for t in parts):  # one 8-bit part: all in the 8-bit form
            parts = [t if len(t) == 2 else as_eight_bit(t) for t in parts]
        if len(parts) == 1:
            fused = parts[0]
        elif len({len(t) for t in parts}) == 1:
            fused = [cat_rows([t[i] for t in parts]) for i in range(len(parts[0]))]
    dense = [linear.weight for linear in linears] if keep_dense or not fused else []
    return CpuLinear(dense, fused, bias, int4_max_rows, dense_dtype, q4q8_matmul=q4q8_matmul, q8q8_matmul=q8q8_matmul, q5q8_matmul=q5q8_matmul)
