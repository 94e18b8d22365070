// The instruction sets this build targets, decided once for every kernel file (ggml's
// ggml-cpu-impl.h plays this part): -march=native sets the compiler's macros, and these name them.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

// The 4-, 5- and 8-bit matmuls' vector loops (csrc/q4q8/)
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define KSPEC_Q4Q8_AVX2 1
#endif
#if KSPEC_Q4Q8_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KSPEC_Q4Q8_VNNI 1
#endif
#if KSPEC_Q4Q8_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define KSPEC_Q4Q8_AMX 1
#endif

#if defined(__AVX2__)
namespace {
// The sum (the max) of a register's 8 lanes
inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float max_lanes(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t sum_lanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}
}  // namespace
#endif

#if KSPEC_Q4Q8_AVX2
namespace {
// An empty instruction that "changes" two sums: the compiler must hold them, as summed so far, in
// registers here, so it neither reorders a chain of integer adds into a tree nor computes a block's
// products ahead of their adds (which spilled them all to the stack: GCC 12 at -O3)
inline void keep_in_registers(__m256i& a, __m256i& b) { asm volatile("" : "+x"(a), "+x"(b)); }
inline void keep_in_register(__m256i& a) { asm volatile("" : "+x"(a)); }
}  // namespace
#endif

// The layer loop's attention (csrc/attention/): its tiles of float32 lanes, 16 a register on
// AVX-512 (attention/avx512.h), 8 on AVX2 (attention/avx2.h); elsewhere PyTorch's flash kernel
#if defined(__AVX512F__)
#define KSPEC_ATTENTION_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define KSPEC_ATTENTION_AVX2 1
#endif
#if KSPEC_ATTENTION_AVX512 || KSPEC_ATTENTION_AVX2
#define KSPEC_LANES_ATTENTION 1
#endif
