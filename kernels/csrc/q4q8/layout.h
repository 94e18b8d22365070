// The 4-, 5-, 6- and 8-bit forms' layout (q4_q8_matmul.cpp says what they hold) and the activations'
// 8-bit blocks of 32 (`Quantized`), shared by every ISA's loops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include "../simd.h"

namespace {

using at::Tensor;

constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 16;                 // outputs stored interleaved, one per 32-bit lane
constexpr int64_t kParamsPerBlock = 2 * kTile;  // float16 s of the tile's outputs, then m
constexpr int64_t kPrefetchBlocks = 4;        // blocks of a tile read ahead by the AVX-512 VNNI loop
// ... and by the AVX2 loops (Zen 3, the 120 projections in one process against the old prefetch,
// which read 4 blocks ahead and only 2 of a block's 4 code lines: 1.2x at 1 to 8 rows with 8
// blocks, 1.1x with 4 or 16)
constexpr int64_t kPrefetchBlocksAvx2 = 8;

// Bytes of one tile's codes per block: 16 outputs x 32 weights, 4-bit codes two a byte; 5- and
// 6-bit ones as the 4-bit codes and a 64-byte register of their fifth (then sixth) bits
template <int Bits>
constexpr int64_t kTileBytes = kTile * Bits * kBlock / 8;  // 256, 320, 384 or 512

// 64-byte registers of one tile's codes per block, each holding 4 bytes of every one of its 16 outputs
template <int Bits>
constexpr int64_t kTileRegisters = kTileBytes<Bits> / 64;  // 4, 5, 6 or 8

// The 6-bit form's codes are centred: w = s (u - 32), one s per half block (weights 0 .. 15, 16 .. 31)
constexpr int32_t kSixBitZero = 32;

// A symmetric form holds its s alone (GGUF Q4_0, Q5_0 and Q8_0: codes centred on 2^(bits - 1), w = d (q - 8),
// d (q - 16), d (u - 128)): m = -2^(bits - 1) s, exact in float16 (a power of two times a float16)
template <int Bits>
constexpr float kSymmetricZero = -static_cast<float>(1 << (Bits - 1));

// Where the loops find a block's s and m: the pairs or a symmetric form's s alone. The vector loops
// read each as they go (avx512_vnni.h block_params, avx2.h half_params); the generic loop reads pairs,
// made per tile in a scratch (as_pairs, q4_q8_matmul.cpp dot_tiles_of)
struct PairParams {  // [tiles, blocks, 2, 16] float16: s, then m
  const c10::Half* data;
};
struct SymmetricParams {  // [tiles, blocks, 1, 16] float16: s
  const c10::Half* data;
};

// Tile t's block b's params: its s (then, for pairs, its m 16 values on)
inline const c10::Half* params_of(PairParams p, int64_t blocks, int64_t t, int64_t b) { return p.data + (t * blocks + b) * kParamsPerBlock; }
inline const c10::Half* params_of(SymmetricParams p, int64_t blocks, int64_t t, int64_t b) { return p.data + (t * blocks + b) * kTile; }

#if KSPEC_Q4Q8_AVX2
// Ask for the code lines and the params of the block `ahead` blocks after tile t's block b (its codes at block_codes)
template <int Bits, typename P>
inline void prefetch_block(const uint8_t* block_codes, P params, int64_t blocks, int64_t t, int64_t b, int64_t ahead) {
#pragma GCC unroll 8
  for (int line = 0; line < kTileRegisters<Bits>; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(block_codes + ahead * kTileBytes<Bits> + 64 * line), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(params_of(params, blocks, t, b + ahead)), _MM_HINT_T0);
}
#endif

// Tile t's params as the pairs the generic loop reads [blocks, 2, 16] (a symmetric form's)
template <int Bits>
inline void as_pairs(SymmetricParams params, int64_t blocks, int64_t t, c10::Half* pairs) {
  for (int64_t b = 0; b < blocks; ++b) {
    const c10::Half* s = params_of(params, blocks, t, b);
    c10::Half* out = pairs + b * kParamsPerBlock;
    for (int64_t n = 0; n < kTile; ++n) {
      out[n] = s[n];
      out[kTile + n] = c10::Half(kSymmetricZero<Bits> * static_cast<float>(s[n]));
    }
  }
}

// A 5- or 6-bit tile's block's bit `plane` (4: the fifth, 5: the sixth) of every code: 64 bytes after
// the nibbles' registers, byte b's bit j that bit of register j's byte b (output b / 4's weight
// 4j + b % 4), so that a loop takes it for every byte of register j at once (AVX2: a shift
// and a mask put it in place; AVX-512: a test of bit j makes the byte mask)
inline const uint8_t* high_bits(const uint8_t* block_codes, int plane) { return block_codes + plane * 64; }

// An array of n values left uninitialized (every element is written before it is read)
template <typename T>
std::unique_ptr<T[]> uninitialized(int64_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

struct Quantized {  // x [M, K] as 8-bit blocks
  std::unique_ptr<int8_t[]> a;       // [M, K]
  std::unique_ptr<float[]> scale;    // [M, K/32] d
  std::unique_ptr<float[]> sum;      // [M, K/32] float32 sum of the block's x (the 4-bit form's minimums)
  std::unique_ptr<float[]> code_sum; // [M, K/32] d * sum of the block's a (the 8-bit form's -128 d)
  std::unique_ptr<int32_t[]> half_sums;  // [M, K/16] sum of each half block's a (the 6-bit form's zero)
};

// The per-block sums of x each form's m multiplies: sum(x) for 4 bits, d sum(a) for 5 and 8
template <int Bits>
const std::unique_ptr<float[]>& minimum_sums(const Quantized& q) {
  return Bits == 4 ? q.sum : q.code_sum;
}

// Four activations a[4j .. 4j + 3] as one 32-bit value (unaligned load)
inline int32_t four_bytes(const int8_t* a) {
  int32_t v;
  std::memcpy(&v, a, sizeof v);
  return v;
}

}  // namespace
