// AVX2 (without AVX-512) pieces of the layer loop's attention: a register of 8 float32 lanes for
// lanes.h's tiles, float16 prefix rows converted 8 values an instruction (F16C), and blocks of the
// one-row attention (generic.h's attend_direct) over heads of 64, 8 keys a register block.
#pragma once

#include <cstdint>

#include "../simd.h"
#include "common.h"

namespace {

// F16C: every AVX2 CPU has it; an AVX-512 build converts in avx512.h
#if defined(__F16C__) && !KSPEC_ATTENTION_AVX512
template <int64_t D>
inline void half_row_to_float(const uint16_t* row, float* dst) {
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
}
#endif

#if KSPEC_ATTENTION_AVX2
#define KSPEC_ROW_BLOCKS 1
// One register of float32 lanes and the few operations the attention's tiles use (Zen 3:
// PyTorch's flash calls were a fifth of a one-row step)
struct Lanes {
  using V = __m256;
  static constexpr int64_t kCount = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
};

// The sums of eight registers' lanes, in one register: lane i = the sum of a[i]'s 8 lanes
inline __m256 lane_sums(const __m256 (&a)[8]) {
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));  // halves: lanes 0-3 | 4-7 of a[0..3]
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// scores[j] = q . keys[j] for n rows of 64 (stride): 8 keys at a time, each a chain of 8
// multiply-adds over q held in 8 registers, summed across lanes together (one query's dot key by
// key spent more on each dot's horizontal sum and its latency than on the multiply-adds: Zen 3,
// a one-row step at a 1536-token prompt spent half its time in the attention)
inline void score_rows64(const float* q, const float* keys, int64_t stride, int64_t n, float* scores) {
  __m256 qv[8];
  for (int v = 0; v < 8; ++v) qv[v] = _mm256_loadu_ps(q + 8 * v);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 acc[8];
    const float* block = keys + j * stride;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_mul_ps(qv[0], _mm256_loadu_ps(block + i * stride));
#pragma GCC unroll 8
    for (int v = 1; v < 8; ++v)
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(block + i * stride + 8 * v), acc[i]);
    _mm256_storeu_ps(scores + j, lane_sums(acc));
  }
  for (; j < n; ++j) {
    __m256 acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(keys + j * stride));
    for (int v = 1; v < 8; ++v) acc = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(keys + j * stride + 8 * v), acc);
    scores[j] = sum_lanes(acc);
  }
}

// out [64] += sum_j p[j] values[j] over n rows of 64 (stride), the sum held in 8 registers
inline void weigh_rows64(const float* p, const float* values, int64_t stride, int64_t n, float* out) {
  __m256 acc[8];
  for (int v = 0; v < 8; ++v) acc[v] = _mm256_loadu_ps(out + 8 * v);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 weight = _mm256_set1_ps(p[j]);
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) acc[v] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(values + j * stride + 8 * v), acc[v]);
  }
  for (int v = 0; v < 8; ++v) _mm256_storeu_ps(out + 8 * v, acc[v]);
}
#endif

}  // namespace
