"""A GGUF weight of any type as the terms kspec's kernels multiply (quantized.py `Q4Codes`).

kspec's kernel stores two forms per block of 32 weights of one row with a float scale s and
minimum m: 4-bit codes (w = s q + m, q in 0..15) and 8-bit codes (w = s u + m, u in 0..255, kept
as two 4-bit terms, `eight_bit_terms`), and a 6-bit one with a scale per 16 weights (w = s (u -
32), u in 0..63). Each GGUF type maps to one of them at load:

    Q4_0, Q4_1, Q4_K     4-bit form, the file's codes; Q4_K's 6-bit sub-block scales and mins
                         folded into s = d sc and m = -dmin mn (exact in float32)
    Q8_0, Q5_0, Q5_1,    8-bit form, the file's codes (5-bit codes are 8-bit codes below 32);
    Q5_K                 Q5_K's s = d sc, m = -dmin mn as above
    Q6_K                 6-bit form (`SixBitCodes`), the file's codes and its scales per 16
                         weights d sc; where the build has no 6-bit loop, requantized to the 8-bit
                         form per block of 32 at load (|error| <= 1/254 of the block's largest
                         weight, under a tenth of Q6_K's own rounding step)
    F32, F16, BF16       quantized at load (`EngineConfig.quantize`: q8 by default, q4, or none)
    anything else        (Q2_K, Q3_K, IQ*, TQ*, MXFP4, ...) dequantized by `gguf` and requantized
                         to the nearest form: 4-bit for types under 4 bits a weight, else 8-bit
                         (a non-linear 4-bit grid, IQ4_NL / IQ4_XS / MXFP4, loses 8 % of a block's
                         range on a linear 4-bit one)

The kernel then stores s and m as float16 (quantized.py `TiledTerm`), which rounds the K-types'
products d sc (up to 17 significant bits) by <= 2^-11 relative: far below the 4-bit step. It reads
the file's own bytes a weight for Q4_0, Q5_0 and Q8_0 (their s alone: m is implied); Q4_K's s, m
pairs take 5 bits a weight where the file's super-blocks take 4.5 (docs/measurements/amx-file-bytes.md:
decoding its 6-bit scales per block cost more than the bytes saved).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from kspec.engine.models.quantized import GROUP, Q4Codes, SixBitCodes, eight_bit_terms, requantized_8bit

SUPER = 256  # weights per K-type super-block
FLOAT_TYPES = ("F32", "F16", "BF16")


def eight_bit_numpy(codes: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> list[Q4Codes]:
    """numpy u, s, m -> quantized.eight_bit_terms."""
    as_tensor = lambda a, dtype: torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))  # noqa: E731
    return eight_bit_terms(as_tensor(codes, np.uint8), as_tensor(scale, np.float32), as_tensor(minimum, np.float32))


def four_bit_term(codes: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> list[Q4Codes]:
    """w = s q + m (q [N, K] in 0..15) as one 4-bit term (its zero is m + 8 s)."""
    s = np.ascontiguousarray(scale, dtype=np.float32)
    z = np.ascontiguousarray(minimum, dtype=np.float32) + 8 * s
    return [Q4Codes(torch.from_numpy(np.ascontiguousarray(codes.astype(np.uint8))), torch.from_numpy(s), torch.from_numpy(z))]


def _blocks(data: np.ndarray, block_bytes: int) -> np.ndarray:
    """A tensor's bytes [N, bytes a row] -> [N, blocks a row, block_bytes] uint8."""
    raw = np.asarray(data).view(np.uint8)
    return raw.reshape(raw.shape[0], -1, block_bytes)


def _f16(block: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block [..., bytes] -> [...] float32."""
    return block[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _rows(values: np.ndarray) -> np.ndarray:
    """[N, blocks, ...] -> [N, blocks * ...]."""
    return values.reshape(values.shape[0], -1)


def _nibbles_32(packed: np.ndarray) -> np.ndarray:
    """16 bytes [..., 16] holding weight j in the low nibble of byte j and j + 16 in the high one -> [..., 32]."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32-bit mask [..., 4] (bit j for weight j) -> [..., 32] of 0 or 16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")  # [..., 32]
    return bits.astype(np.uint8) << 4


def k_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins [..., 12] -> (sc, mn) [..., 8] each."""
    s = scales.astype(np.uint8)
    low, high = s[..., 0:4], s[..., 4:8]
    sc = np.concatenate([low & 63, (s[..., 8:12] & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mn = np.concatenate([high & 63, (s[..., 8:12] >> 4) | ((high >> 6) << 4)], axis=-1)
    return sc, mn


def _k_block_params(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K super-blocks [N, B, bytes] -> per-32 (s, m) [N, B * 8]: s = d sc, m = -dmin mn."""
    d, dmin = _f16(blocks, 0)[..., None], _f16(blocks, 2)[..., None]  # [N, B, 1]
    sc, mn = k_scales_mins(blocks[..., 4:16])  # [N, B, 8]
    return _rows(d * sc), _rows(-dmin * mn)


def _q4_k_codes(blocks: np.ndarray) -> np.ndarray:
    """Q4_K's 128 bytes of codes [N, B, 128] -> [N, B * 256]: chunk j of 32 bytes holds weights
    64 j .. 64 j + 31 in its low nibbles and the next 32 in its high ones."""
    qs = blocks.reshape(*blocks.shape[:2], 4, 32)  # [N, B, 4, 32]
    return _rows(np.stack([qs & 0x0F, qs >> 4], axis=3))  # [N, B, 4, 2, 32]


def q4_k(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 144)  # d, dmin, scales[12], qs[128]
    scale, minimum = _k_block_params(blocks)
    return four_bit_term(_q4_k_codes(blocks[..., 16:]), scale, minimum)


def q5_k(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 176)  # d, dmin, scales[12], qh[32], qs[128]
    scale, minimum = _k_block_params(blocks)
    low = _q4_k_codes(blocks[..., 48:]).reshape(*blocks.shape[:2], 8, 32)  # [N, B, 8, 32]
    qh = blocks[..., 16:48]  # [N, B, 32]: bit i of byte l is weight 32 i + l's fifth bit
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [N, B, 8, 32]
    return eight_bit_numpy(_rows(low + (high << 4)), scale, minimum)


def q6_k(data: np.ndarray) -> list[SixBitCodes]:
    """Q6_K's own codes and scales: w = d sc (q - 32), q in 0..63, sc per 16 weights."""
    blocks = _blocks(data, 210)  # ql[128], qh[64], scales[16] int8, d
    ql = blocks[..., 0:128].reshape(*blocks.shape[:2], 2, 64)  # [N, B, half, 64]
    qh = blocks[..., 128:192].reshape(*blocks.shape[:2], 2, 32)  # [N, B, half, 32]
    low = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)  # [N, B, 2, 4, 32]
    high = np.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], axis=3)  # [N, B, 2, 4, 32]
    sc = blocks[..., 192:208].view(np.int8).astype(np.float32)  # [N, B, 16]: one a 16 weights, in order
    scale = _f16(blocks, 208)[..., None] * sc  # [N, B, 16]
    codes = torch.from_numpy(np.ascontiguousarray(_rows(low | (high << 4)), dtype=np.uint8))
    return [SixBitCodes(codes, torch.from_numpy(np.ascontiguousarray(_rows(scale), dtype=np.float32)))]


def q8_0(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 34)  # d, q[32] int8
    d = _f16(blocks, 0)
    u = _rows(blocks[..., 2:].view(np.int8).astype(np.int16) + 128)
    return eight_bit_numpy(u, d, -128 * d)


def q4_0(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 18)  # d, qs[16]
    d = _f16(blocks, 0)
    return four_bit_term(_rows(_nibbles_32(blocks[..., 2:])), d, -8 * d)


def q4_1(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 20)  # d, m, qs[16]
    return four_bit_term(_rows(_nibbles_32(blocks[..., 4:])), _f16(blocks, 0), _f16(blocks, 2))


def q5_0(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 22)  # d, qh[4], qs[16]
    d = _f16(blocks, 0)
    u = _nibbles_32(blocks[..., 6:]) | _high_bits_32(blocks[..., 2:6])
    return eight_bit_numpy(_rows(u), d, -16 * d)


def q5_1(data: np.ndarray) -> list[Q4Codes]:
    blocks = _blocks(data, 24)  # d, m, qh[4], qs[16]
    u = _nibbles_32(blocks[..., 8:]) | _high_bits_32(blocks[..., 4:8])
    return eight_bit_numpy(_rows(u), _f16(blocks, 0), _f16(blocks, 2))


def quantize_8bit(weight: np.ndarray) -> list[Q4Codes]:
    """A float matrix [N, K] as Q8_0 does it: per block of 32, d = max |w| / 127, q = round(w / d)."""
    return requantized_8bit(torch.from_numpy(np.array(weight, dtype=np.float32)))


FOUR_BIT_SEARCH = tuple(15 + 0.25 * t for t in range(-4, 9))  # code ranges tried per block (llama.cpp's make_qkx2_quants idea)


def _least_squares(groups: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s, m [N, B] minimising |s q + m - w|^2 per block for fixed codes q [N, B, 32]."""
    n = float(GROUP)
    sq, sw, sqq, sqw = q.sum(-1), groups.sum(-1), (q * q).sum(-1), (q * groups).sum(-1)
    det = n * sqq - sq * sq
    fit = det > 0
    s = torch.where(fit, (n * sqw - sq * sw) / torch.where(fit, det, 1), torch.zeros_like(sq))
    m = torch.where(fit, (sw - s * sq) / n, sw / n)
    return s, m


def quantize_4bit(weight: np.ndarray) -> list[Q4Codes]:
    """A float matrix [N, K] per block of 32 with a float scale and minimum (Q4_1's form). Each
    block tries the codes of several steps (its range over 14-17 levels, FOUR_BIT_SEARCH), fits s
    and m to each by least squares, and keeps the one of least squared error: a random 2-layer
    model's mean |delta logit| 0.046 with one step (Q4_0: 0.046), 0.036 with the search (Q4_K: 0.033;
    bench/quant_error.py)."""
    w = torch.from_numpy(np.array(weight, dtype=np.float32))  # a copy: the caller's array may be read-only
    rows = w.shape[0]
    groups = w.view(rows, -1, GROUP)  # [N, K/32, 32]
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)  # [N, K/32, 1]
    best_q = torch.zeros_like(groups)
    best_s, best_m = torch.zeros_like(low[..., 0]), low[..., 0].clone()
    best_error = torch.full_like(best_s, float("inf"))
    for levels in FOUR_BIT_SEARCH:
        step = ((high - low) / levels).clamp_min(1e-12)
        q = ((groups - low) / step).round().clamp(0, 15)  # [N, K/32, 32]
        s, m = _least_squares(groups, q)
        error = ((s[..., None] * q + m[..., None] - groups) ** 2).sum(-1)  # [N, K/32]
        better = error < best_error
        best_q = torch.where(better[..., None], q, best_q)
        best_s, best_m, best_error = torch.where(better, s, best_s), torch.where(better, m, best_m), torch.where(better, error, best_error)
    return four_bit_term(best_q.to(torch.uint8).reshape(rows, -1).numpy(), best_s.numpy(), best_m.numpy())


DECODERS: dict[str, Callable[[np.ndarray], list[Q4Codes]]] = {
    "Q4_0": q4_0, "Q4_1": q4_1, "Q4_K": q4_k, "Q5_0": q5_0, "Q5_1": q5_1, "Q5_K": q5_k, "Q8_0": q8_0,
    "Q6_K": q6_k,
}  # fmt: skip
NATIVE_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")  # the file's codes kept as they are


def bits_per_weight(kind: str) -> float:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return 8 * size / block


def converted_to(kind: str, float_quantization: str = "q8") -> str:
    """What a tensor of GGUF type `kind` becomes: 'codes' (the file's own), 'q8' or 'q4'
    (requantized), or 'dense' (kept as floats)."""
    if kind in NATIVE_TYPES:
        return "codes"
    if kind in FLOAT_TYPES:
        return "dense" if float_quantization == "none" else float_quantization
    return "q4" if bits_per_weight(kind) < 4 else "q8"


HEAD_NAMES = ("lm_head.weight", "model.embed_tokens.weight")  # 8-bit under q4: see float_quantization_of


def float_quantization_of(name: str, quantize: str) -> str:
    """What float matrix `name` (an HF name) becomes under EngineConfig.quantize: the head and the
    embedding table (the head when tied) stay 8-bit under q4, as llama.cpp keeps its head at 6
    bits in every 4-bit mix (a random 135M model: mean |delta logit| 0.135 with a 4-bit head,
    llama.cpp's Q4_K_S 0.074; bench/quant_error.py)."""
    return "q8" if quantize == "q4" and name in HEAD_NAMES else quantize


def tensor_terms(
    data: np.ndarray, kind: str, shape: tuple[int, int], float_quantization: str = "q8"
) -> list[Q4Codes] | list[SixBitCodes] | None:
    """A GGUF matrix (its data as `GGUFReader` gives it, `kind` its type name, shape [N, K]) as
    kspec's terms, or None where it stays a dense float matrix (K not a multiple of 32, or a float
    matrix with float_quantization 'none')."""
    rows, cols = shape
    if cols % GROUP:
        return None
    if kind in DECODERS:
        return DECODERS[kind](data)
    target = converted_to(kind, float_quantization)
    if target == "dense":
        return None
    from gguf import GGMLQuantizationType, quants

    plain = kind in ("F32", "F16")  # BF16 comes as raw 16-bit words: gguf decodes it
    values = np.asarray(data, dtype=np.float32) if plain else quants.dequantize(np.asarray(data), GGMLQuantizationType[kind])
    values = np.asarray(values, dtype=np.float32).reshape(rows, cols)
    return quantize_4bit(values) if target == "q4" else quantize_8bit(values)
