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

// The Q4_K form: the 4-bit form's codes with a GGUF Q4_K weight's own parameters, per tile and super-block
// of 8 blocks (256 weights) 256 bytes [N/16, K/256, 256]: the 16 outputs' d (float16), their dmin, then
// per block j the low 4 bits of its 6-bit sc and mn (a byte an output: sc low, mn high, [8, 16]), then the
// high 2 bits of both (four bits an output and block, blocks 2i and 2i + 1 in a byte's low and high
// nibble: sc's 2 bits, then mn's, [4, 16]). 4.5 bits a weight, the file's own; s = d sc and m = -dmin mn,
// each rounded once to float16, as the pairs of the same weight hold them.
constexpr int64_t kSuperBlocks = 8;  // blocks of 32 a super-block
constexpr int64_t kQ4KSuperBytes = 256;
constexpr int64_t kQ4KLowAt = 4 * kTile, kQ4KHighAt = kQ4KLowAt + kSuperBlocks * kTile;

// Where the loops find a block's s and m: the pairs, a symmetric form's s alone, or the Q4_K form's own.
// The VNNI and AMX loops read each as they go (avx512_vnni.h block_params); the AVX2 and generic loops
// read pairs, made per tile in a scratch that stays in cache (q4_q8_matmul.cpp matmul_form)
struct PairParams {  // [tiles, blocks, 2, 16] float16: s, then m
  const c10::Half* data;
};
struct SymmetricParams {  // [tiles, blocks, 1, 16] float16: s
  const c10::Half* data;
};
struct Q4KParams {  // [tiles, blocks / 8, 256]
  const uint8_t* data;
};

// The bytes holding tile t's block b's params (for a prefetch)
inline const void* params_of(PairParams p, int64_t blocks, int64_t t, int64_t b) { return p.data + (t * blocks + b) * kParamsPerBlock; }
inline const void* params_of(SymmetricParams p, int64_t blocks, int64_t t, int64_t b) { return p.data + (t * blocks + b) * kTile; }
inline const void* params_of(Q4KParams p, int64_t blocks, int64_t t, int64_t b) {
  return p.data + (t * (blocks / kSuperBlocks) + b / kSuperBlocks) * kQ4KSuperBytes + (b % kSuperBlocks) * (kQ4KSuperBytes / kSuperBlocks);
}

// A Q4_K super-block's block j: its 16 outputs' 6-bit sc and mn as bytes
#if KSPEC_Q4Q8_AVX2
inline void q4_k_codes(const uint8_t* super, int64_t j, __m128i& sc, __m128i& mn) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + kQ4KLowAt + j * kTile));
  const __m128i hi = _mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(super + kQ4KHighAt + (j / 2) * kTile)),
                                    4 * static_cast<int>(j % 2));
  const __m128i three = _mm_set1_epi8(3), fifteen = _mm_set1_epi8(15);
  sc = _mm_or_si128(_mm_and_si128(lo, fifteen), _mm_slli_epi16(_mm_and_si128(hi, three), 4));
  mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), fifteen), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hi, 2), three), 4));
}

constexpr int kRoundHalf = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // float32 -> float16: to nearest even
#endif

// Tile t's params as the pairs the AVX2 and generic loops read [blocks, 2, 16]: a symmetric form's
template <int Bits>
inline void as_pairs(SymmetricParams params, int64_t blocks, int64_t t, c10::Half* pairs) {
  for (int64_t b = 0; b < blocks; ++b) {
    const c10::Half* s = params.data + (t * blocks + b) * kTile;
    c10::Half* out = pairs + b * kParamsPerBlock;
#if KSPEC_Q4Q8_AVX2
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8 * h));
      const __m256 m = _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(kSymmetricZero<Bits>));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * h), bits);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + kTile + 8 * h), _mm256_cvtps_ph(m, kRoundHalf));
    }
#else
    for (int64_t n = 0; n < kTile; ++n) {
      out[n] = s[n];
      out[kTile + n] = c10::Half(kSymmetricZero<Bits> * static_cast<float>(s[n]));
    }
#endif
  }
}

// ... and the Q4_K form's: s = float16(d sc), m = float16(-dmin mn) (the products exact in float32)
template <int Bits>
inline void as_pairs(Q4KParams params, int64_t blocks, int64_t t, c10::Half* pairs) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* super = static_cast<const uint8_t*>(params_of(params, blocks, t, b - b % kSuperBlocks));
    const c10::Half* d = reinterpret_cast<const c10::Half*>(super);
    const c10::Half* dmin = d + kTile;
    c10::Half* out = pairs + b * kParamsPerBlock;
#if KSPEC_Q4Q8_AVX2
    __m128i sc, mn;
    q4_k_codes(super, b % kSuperBlocks, sc, mn);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // outputs 8 h .. 8 h + 7
      const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 8 * h)));
      const __m256 dminv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin + 8 * h)));
      const __m128i sc_h = h == 0 ? sc : _mm_srli_si128(sc, 8), mn_h = h == 0 ? mn : _mm_srli_si128(mn, 8);
      const __m256 s = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc_h)));
      const __m256 m = _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), dminv), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn_h)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * h), _mm256_cvtps_ph(s, kRoundHalf));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + kTile + 8 * h), _mm256_cvtps_ph(m, kRoundHalf));
    }
#else
    const uint8_t* low = super + kQ4KLowAt + (b % kSuperBlocks) * kTile;
    const uint8_t* high = super + kQ4KHighAt + (b % kSuperBlocks / 2) * kTile;
    const int shift = 4 * static_cast<int>(b % 2);
    for (int64_t n = 0; n < kTile; ++n) {
      const int h = (high[n] >> shift) & 15;
      const float sc = static_cast<float>((low[n] & 15) | ((h & 3) << 4)), mn = static_cast<float>((low[n] >> 4) | ((h >> 2) << 4));
      out[n] = c10::Half(static_cast<float>(d[n]) * sc);
      out[kTile + n] = c10::Half(-static_cast<float>(dmin[n]) * mn);
    }
#endif
  }
}

// Bit `plane` (4: the fifth, 5: the sixth) of register j's codes (weights 4j .. 4j + 3 of each
// output) of a 5- or 6-bit tile's block, as a 64-bit mask: bit 4 n + i for output n's weight 4j + i
inline uint64_t high_bits(const uint8_t* block_codes, int plane, int64_t j) {
  uint64_t mask;
  std::memcpy(&mask, block_codes + plane * 64 + 8 * j, sizeof mask);
  return mask;
}

#if KSPEC_Q4Q8_AVX2
// Ask for the code lines and the params of the block `ahead` blocks after this one of a tile
template <int Bits>
inline void prefetch_block(const uint8_t* block_codes, const c10::Half* block_params, int64_t ahead) {
#pragma GCC unroll 8
  for (int line = 0; line < kTileRegisters<Bits>; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(block_codes + ahead * kTileBytes<Bits> + 64 * line), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(block_params + ahead * kParamsPerBlock), _MM_HINT_T0);
}
#endif

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
