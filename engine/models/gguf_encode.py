"""Float weights to GGUF block bytes, for writing model files (bench/model_shapes.py, tests).

`gguf`'s own `quantize` covers Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the float types; the K-types
(Q4_K, Q5_K, Q6_K) are encoded here, in their block layouts as llama.cpp reads them (ggml-quants.c
`dequantize_row_q*_K`). The rounding is plain (no search for better scales, which llama.cpp's
`make_qkx2_quants` does): files for speed and memory measurements and for checking the decoders
(gguf_blocks.py) against `gguf`'s `dequantize`, not for quality.
"""

from __future__ import annotations

import numpy as np

SUPER = 256  # weights per K-type super-block
SUB = 32  # weights per Q4_K / Q5_K sub-block
SUB6 = 16  # weights per Q6_K sub-block
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """[...] float -> [..., 2] uint8 (float16, little-endian)."""
    return np.ascontiguousarray(values.astype(np.float16)[..., None]).view(np.uint8)


def _safe(values: np.ndarray) -> np.ndarray:
    return np.where(values > 0, values, 1)


def _affine_sub_blocks(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """x [N, B, 8, 32] -> (d, dmin [N, B] float16 values, sc, mn [N, B, 8] 6-bit, q [N, B, 8, 32])
    with w ~ d sc q - dmin mn, q in 0..levels."""
    low = np.minimum(x.min(axis=-1), 0)  # [N, B, 8]: Q4_K's mins are subtracted, so <= 0
    high = x.max(axis=-1)
    scale, minimum = (high - low) / levels, -low
    d = (scale.max(axis=-1) / 63).astype(np.float16).astype(np.float32)  # [N, B]
    dmin = (minimum.max(axis=-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / _safe(d)[..., None]), 0, 63)
    mn = np.clip(np.rint(minimum / _safe(dmin)[..., None]), 0, 63)
    step, offset = d[..., None] * sc, dmin[..., None] * mn  # [N, B, 8]
    q = np.clip(np.rint((x + offset[..., None]) / _safe(step)[..., None]), 0, levels)
    return d, dmin, sc.astype(np.uint8), mn.astype(np.uint8), q.astype(np.uint8)


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """6-bit sc, mn [N, B, 8] -> Q4_K / Q5_K's 12 bytes [N, B, 12] (get_scale_min_k4's packing)."""
    head = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    mins = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    tail = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    return np.concatenate([head, mins, tail], axis=-1)


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """q [N, B, 8, 32] -> 128 bytes [N, B, 128]: chunk c holds sub-block 2c low, 2c + 1 high."""
    pairs = q.reshape(*q.shape[:2], 4, 2, SUB) & 0x0F  # [N, B, 4, 2, 32]
    return (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(*q.shape[:2], 128)


def encode_q4_k(weight: np.ndarray) -> np.ndarray:
    """[N, K] float (K a multiple of 256) -> [N, K/256 * 144] uint8."""
    n = weight.shape[0]
    x = np.asarray(weight, dtype=np.float32).reshape(n, -1, 8, SUB)
    d, dmin, sc, mn, q = _affine_sub_blocks(x, 15)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), _low_nibbles(q)], axis=-1)
    return blocks.reshape(n, -1)


def encode_q5_k(weight: np.ndarray) -> np.ndarray:
    """[N, K] float (K a multiple of 256) -> [N, K/256 * 176] uint8."""
    n = weight.shape[0]
    x = np.asarray(weight, dtype=np.float32).reshape(n, -1, 8, SUB)
    d, dmin, sc, mn, q = _affine_sub_blocks(x, 31)
    fifth = (q >> 4) << np.arange(8, dtype=np.uint8)[:, None]  # [N, B, 8, 32]: sub-block i's bit i
    qh = np.bitwise_or.reduce(fifth, axis=2)  # [N, B, 32]
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), qh, _low_nibbles(q)], axis=-1)
    return blocks.reshape(n, -1)


def encode_q6_k(weight: np.ndarray) -> np.ndarray:
    """[N, K] float (K a multiple of 256) -> [N, K/256 * 210] uint8: w ~ d sc (q - 32) per 16."""
    n = weight.shape[0]
    x = np.asarray(weight, dtype=np.float32).reshape(n, -1, SUPER // SUB6, SUB6)  # [N, B, 16, 16]
    scale = np.abs(x).max(axis=-1) / 31  # [N, B, 16]
    d = (scale.max(axis=-1) / 127).astype(np.float16).astype(np.float32)  # [N, B]
    sc = np.clip(np.rint(scale / _safe(d)[..., None]), -128, 127)
    step = d[..., None] * sc
    q = (np.clip(np.rint(x / _safe(step)[..., None]), -32, 31) + 32).astype(np.uint8)  # [N, B, 16, 16]
    q = q.reshape(n, -1, 2, 4, SUB)  # [N, B, half, i, l]: weight 128 half + 32 i + l
    ql = np.concatenate([q[:, :, :, 0] & 0x0F | (q[:, :, :, 2] & 0x0F) << 4, q[:, :, :, 1] & 0x0F | (q[:, :, :, 3] & 0x0F) << 4], axis=-1)
    qh = sum((q[:, :, :, i] >> 4) << (2 * i) for i in range(4)).astype(np.uint8)  # [N, B, 2, 32]
    blocks = np.concatenate(
        [ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1
    )
    return blocks.reshape(n, -1)


ENCODERS = {"Q4_K": encode_q4_k, "Q5_K": encode_q5_k, "Q6_K": encode_q6_k}


def encode(weight: np.ndarray, kind: str) -> np.ndarray:
    """A float matrix [N, K] as GGUF type `kind`'s bytes [N, bytes a row] (uint8), or as float
    values for F32/F16/BF16 (what `GGUFWriter.add_tensor` takes with raw_dtype)."""
    from gguf import GGMLQuantizationType, quants

    if kind in ENCODERS:
        if weight.shape[1] % SUPER:
            raise ValueError(f"{kind} needs rows of a multiple of {SUPER} weights, got {weight.shape[1]}")
        return ENCODERS[kind](weight)
    return np.asarray(quants.quantize(np.asarray(weight, dtype=np.float32), GGMLQuantizationType[kind]))
