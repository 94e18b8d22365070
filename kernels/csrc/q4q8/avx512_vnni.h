// AVX-512 VNNI loops of the 4-, 5-, 6- and 8-bit forms (vpdpbusd: 64 unsigned x signed byte products a
// register).
#pragma once

#include "layout.h"

#if KSPEC_Q4Q8_VNNI
namespace {

constexpr int kMaxRows = 12;  // rows one pass over a tile's block serves, at most (dot_range_vnni)

// One block of 32 activations: a = round(x / d) (to nearest even), d = max|x| / 127; the sum of the
// block's x, d times the sum of its a and the sums of its a's halves
inline void quantize_block_vnni(const float* xb, int8_t* ab, float& d, float& total, float& code_sum, int32_t* halves) {
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  total = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
  d = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(d > 0.f ? 1.f / d : 0.f);
  const __m512i a0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i a1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ab), _mm512_cvtepi32_epi8(a0));  // |a| <= 127: no saturation
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ab + 16), _mm512_cvtepi32_epi8(a1));
  halves[0] = _mm512_reduce_add_epi32(a0);
  halves[1] = _mm512_reduce_add_epi32(a1);
  code_sum = d * static_cast<float>(halves[0] + halves[1]);
}

// A block's codes of one tile as 8 registers of bytes, register j holding weights 4j .. 4j + 3 of
// each of the 16 outputs (the 8-bit form's codes are those bytes already)
template <int Bits>
inline void unpack_codes(const uint8_t* tc, __m512i* w) {
  if constexpr (Bits == 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(tc + 64 * j);
  } else {
    const __m512i low_mask = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i packed = _mm512_loadu_si512(tc + 64 * p);
      w[p] = _mm512_and_si512(packed, low_mask);                           // weights 4p ..
      w[p + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);  // weights 16 + 4p ..
    }
#pragma GCC unroll 2
    for (int plane = 4; plane < Bits; ++plane) {  // 5/6-bit: 2^plane in register j where bit j of the plane's bytes says
      const __m512i bits = _mm512_loadu_si512(high_bits(tc, plane));
      const __m512i value = _mm512_set1_epi8(static_cast<char>(1 << plane));
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        w[j] = _mm512_mask_add_epi8(w[j], _mm512_test_epi8_mask(bits, _mm512_set1_epi8(static_cast<char>(1 << j))), w[j], value);
    }
  }
}

// acc + s d float(dot) + m sum_x for one row and block, in this order (every loop that scales a block's
// integer sums calls it, so that they give the same bits: the AMX loop too)
inline __m512 add_scaled_block(__m512 acc, __m512 scales, __m512 mins, __m512 d, __m512 sum_x, __m512i dot) {
  const __m512 with_mins = _mm512_fmadd_ps(mins, sum_x, acc);
  return _mm512_fmadd_ps(_mm512_mul_ps(scales, d), _mm512_cvtepi32_ps(dot), with_mins);
}

// The 6-bit form's: acc + d (s0 float(dot0) + s1 float(dot1)), the dots less 32 times their half's sum of a
inline __m512 add_scaled_halves(__m512 acc, __m512 s0, __m512 s1, __m512 d, __m512i dot0, __m512i dot1) {
  const __m512 halves_sum = _mm512_fmadd_ps(s0, _mm512_cvtepi32_ps(dot0), _mm512_mul_ps(s1, _mm512_cvtepi32_ps(dot1)));
  return _mm512_fmadd_ps(d, halves_sum, acc);
}

// Tile t's block b's s and m (16 outputs each) from the pairs, ...
template <int Bits>
inline void block_params(PairParams p, int64_t blocks, int64_t t, int64_t b, __m512& s, __m512& m) {
  const c10::Half* tp = params_of(p, blocks, t, b);  // [2, 16]
  s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp)));
  m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + kTile)));
}

// ... or a symmetric form's s alone (m = -2^(bits - 1) s: exact, as the pairs hold it)
template <int Bits>
inline void block_params(SymmetricParams p, int64_t blocks, int64_t t, int64_t b, __m512& s, __m512& m) {
  s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(params_of(p, blocks, t, b))));
  m = _mm512_mul_ps(s, _mm512_set1_ps(kSymmetricZero<Bits>));
}

// AVX-512 VNNI: T tiles (16 T outputs) x R rows. A block's codes unpack into 8 registers per
// tile (weights 4j .. 4j + 3 of each output in its lane), used by every row; a row's 8 broadcast
// groups of four activations serve every tile. Per row, tile and block: 8 vpdpbusd into a fresh
// int32 sum (exact: 32 * 255 * 127 < 2^31), then y += s d float(sum) + m sum_x. With few sums
// (T R <= 2) each block's integer sum is split in two chains so that the loop is not bound by one
// chain of 8 dependent vpdpbusd. The 6-bit form always keeps two sums, one per half block (its
// weights 0 .. 15 and 16 .. 31 have scales of their own): y += d (s0 (dot0 - 32 a0) + s1 (dot1 - 32 a1)),
// a0 and a1 the halves' sums of a, each half's sum started at -32 a (integers until one conversion).
template <int Bits, int T, int R, typename P>
void dot_tiles_vnni(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t0, float* y, int64_t ldy) {
  static_assert(T >= 1 && T <= 4 && R >= 1 && R <= kMaxRows && (Bits == 4 || Bits == 5 || Bits == 6 || Bits == 8));
  constexpr bool kHalves = Bits == 6;
  constexpr int kChains = kHalves || T * R <= 2 ? 2 : 1;
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;                // [R, blocks]
  const float* xs = minimum_sums<Bits>(q).get() + r0 * blocks;  // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  __m512 acc[T][R];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i w[T][8];
    __m512 scales[T], mins[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const uint8_t* tc = codes + ((t0 + t) * blocks + b) * kTileBytes<Bits>;  // [registers, 16, 4]
      prefetch_block<Bits>(tc, params, blocks, t0 + t, b, kPrefetchBlocks);
      unpack_codes<Bits>(tc, w[t]);
      block_params<Bits>(params, blocks, t0 + t, b, scales[t], mins[t]);
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m512i dots[kChains][T];
      const int32_t* halves = kHalves ? q.half_sums.get() + 2 * ((r0 + r) * blocks + b) : nullptr;
#pragma GCC unroll 2
      for (int c = 0; c < kChains; ++c) {  // the 6-bit form's halves start at -32 sum a: its codes' zero
        const __m512i start = kHalves ? _mm512_set1_epi32(-kSixBitZero * halves[c]) : _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) dots[c][t] = start;
      }
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i four = _mm512_set1_epi32(four_bytes(a + 4 * j));
        const int c = kHalves ? j / 4 : j % kChains;
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) dots[c][t] = _mm512_dpbusd_epi32(dots[c][t], w[t][j], four);
      }
      const __m512 d = _mm512_set1_ps(xd[r * blocks + b]);
      if constexpr (kHalves) {
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t)  // scales[t]: s of weights 0 .. 15, mins[t]: s of 16 .. 31
          acc[t][r] = add_scaled_halves(acc[t][r], scales[t], mins[t], d, dots[0][t], dots[1][t]);
        continue;
      }
      const __m512 sum_x = _mm512_set1_ps(xs[r * blocks + b]);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i dot = kChains == 2 ? _mm512_add_epi32(dots[0][t], dots[kChains - 1][t]) : dots[0][t];
        acc[t][r] = add_scaled_block(acc[t][r], scales[t], mins[t], d, sum_x, dot);
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * ldy + (t0 + t) * kTile, acc[t][r]);
}

// Rows first .. rows - 1 of tiles t0 .. t0 + T - 1, R_MAX rows at a time
template <int Bits, int T, int RMax, typename P>
void dot_rows_vnni(const Quantized& q, int64_t first, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t0,
                   float* y, int64_t ldy) {
  int64_t r = first;
  for (; r + RMax <= rows; r += RMax) dot_tiles_vnni<Bits, T, RMax>(q, r, codes, params, k, t0, y, ldy);
  switch (rows - r) {
    case 11: if constexpr (RMax > 11) dot_tiles_vnni<Bits, T, 11>(q, r, codes, params, k, t0, y, ldy); break;
    case 10: if constexpr (RMax > 10) dot_tiles_vnni<Bits, T, 10>(q, r, codes, params, k, t0, y, ldy); break;
    case 9: if constexpr (RMax > 9) dot_tiles_vnni<Bits, T, 9>(q, r, codes, params, k, t0, y, ldy); break;
    case 8: if constexpr (RMax > 8) dot_tiles_vnni<Bits, T, 8>(q, r, codes, params, k, t0, y, ldy); break;
    case 7: if constexpr (RMax > 7) dot_tiles_vnni<Bits, T, 7>(q, r, codes, params, k, t0, y, ldy); break;
    case 6: if constexpr (RMax > 6) dot_tiles_vnni<Bits, T, 6>(q, r, codes, params, k, t0, y, ldy); break;
    case 5: if constexpr (RMax > 5) dot_tiles_vnni<Bits, T, 5>(q, r, codes, params, k, t0, y, ldy); break;
    case 4: if constexpr (RMax > 4) dot_tiles_vnni<Bits, T, 4>(q, r, codes, params, k, t0, y, ldy); break;
    case 3: if constexpr (RMax > 3) dot_tiles_vnni<Bits, T, 3>(q, r, codes, params, k, t0, y, ldy); break;
    case 2: if constexpr (RMax > 2) dot_tiles_vnni<Bits, T, 2>(q, r, codes, params, k, t0, y, ldy); break;
    case 1: if constexpr (RMax > 1) dot_tiles_vnni<Bits, T, 1>(q, r, codes, params, k, t0, y, ldy); break;
    default: break;
  }
}

// Rows first .. rows - 1 of tiles t0 .. t1 - 1, one tile at a time over 8 rows (its unpacked codes and 8 sums in registers;
// measured: two tiles at a time at one or two rows 1.1-1.3x slower); the 6-bit form over 12, its
// costlier unpacking shared by more rows (Zen 4, a 53760 x 1536 weight against the 8-bit form of the
// same weight: 0.98x at 12 rows and 0.94x at 16 over 8 rows, 1.13x and 1.07x over 12)
template <int Bits, typename P>
void dot_range_vnni(const Quantized& q, int64_t first, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t0,
                    int64_t t1, float* y, int64_t ldy) {
  constexpr int kRows = Bits == 6 ? kMaxRows : 8;
  for (int64_t t = t0; t < t1; ++t) dot_rows_vnni<Bits, 1, kRows>(q, first, rows, codes, params, k, t, y, ldy);
}

}  // namespace
#endif
