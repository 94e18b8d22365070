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

#if KSPEC_Q4Q8_AVX2
namespace {
// An empty instruction that "changes" two sums: the compiler must hold them, as summed so far, in
// registers here, so it neither reorders a chain of integer adds into a tree nor computes a block's
// products ahead of their adds (which spilled them all to the stack: GCC 12 at -O3)
inline void keep_in_registers(__m256i& a, __m256i& b) { asm volatile("" : "+x"(a), "+x"(b)); }
inline void keep_in_register(__m256i& a) { asm volatile("" : "+x"(a)); }
}  // namespace
#endif

// The layer loop's written-out attention: 16 float32 lanes a register on AVX-512, 8 on AVX2
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define KSPEC_LANES_ATTENTION 1
namespace {
// One register of float32 lanes and the few operations the attention's tiles use: 16 lanes on
// AVX-512, 8 on AVX2 (Zen 3: PyTorch's flash calls were a fifth of a one-row step)
struct Lanes {
#if defined(__AVX512F__)
  using V = __m512;
  static constexpr int64_t kCount = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
#else
  using V = __m256;
  static constexpr int64_t kCount = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
#endif
};
}  // namespace
#endif
