// AVX-512 pieces of the layer loop's attention: a register of 16 float32 lanes for lanes.h's
// tiles, and float16 prefix rows converted 16 values an instruction.
#pragma once

#include <cstdint>

#include "../simd.h"
#include "common.h"

#if KSPEC_ATTENTION_AVX512
namespace {

// One register of float32 lanes and the few operations the attention's tiles use
struct Lanes {
  using V = __m512;
  static constexpr int64_t kCount = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
};

template <int64_t D>
inline void half_row_to_float(const uint16_t* row, float* dst) {
  for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d))));
}

}  // namespace
#endif
