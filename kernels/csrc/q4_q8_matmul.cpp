// y = x W^T with W in 4-bit blocks and x quantized to 8 bits per block of 32: kspec's own CPU
// matmul for a decode step's few rows where PyTorch's int4 kernel is not vectorized well
// (an AVX2 CPU: kernels/cpu_layers.py says where; engine/models/quantized.py Q4Q8Term holds
// the weights). The same arithmetic as llama.cpp's Q4_1 x Q8_1 dot product:
//
//   weights, one output row n, block b of 32:   w[j] = s[n,b] * q[j] + m[n,b],  q in 0..15
//   activations, one row r, block b:            x[j] ~ d[r,b] * a[j],  a in -127..127
//                                               (d = max|x| / 127, a = round(x / d))
//   y[r,n] = sum_b  s[n,b] d[r,b] (sum_j q[j] a[j])  +  m[n,b] (sum_j x[j])
//
// The integer sums are exact (AVX2: maddubs on unsigned codes x signed activations, no
// saturation: 2 * 15 * 127 < 2^15); the block sums of x are float32 sums of the activations
// themselves, so the only rounding beyond float32 is the activations' own to 8 bits (relative
// error <= 1/254 of a block's largest value). s and m are float16, as a GGUF stores them.
//
// Layout, in tiles of 16 weight rows (outputs), one output per 32-bit lane of a 64-byte register:
// codes [N/16, K/32, 4, 16, 4] uint8, register p (0..3) of a block holding each output's GGUF
// bytes 4p .. 4p + 3, i.e. weights 4p .. 4p + 3 in the low nibbles and 16 + 4p .. 16 + 4p + 3 in
// the high ones; params [N/16, K/32, 2, 16] float16 (the 16 outputs' s of the block, then their
// m: one 64-byte line). Against four activations broadcast to every lane, one vpdpbusd (AVX-512
// VNNI) or maddubs (AVX2) gives each output's dot of four weights, so a block is 8 integer
// instructions for 16 outputs and its float scaling one multiply-add per 16 outputs; the 4-output
// groups this replaced spent as many float instructions as integer ones (measured on Zen 4:
// README "The 4-bit matmul in tiles of 16 outputs").
//
// The 8-bit form (q8_q8_matmul: a GGUF Q8_0 weight, w = d q with q in -127..127, the default
// model's tied head) is the same loop over whole-byte codes u = q + 128 in 0..255:
//
//   y[r,n] = sum_b  s[n,b] d[r,b] (sum_j u[j] a[j])  +  m[n,b] d[r,b] (sum_j a[j])
//
// with s = d and m = -128 d, i.e. sum_b d[n,b] d[r,b] (q . a): llama.cpp's Q8_0 x Q8_0 dot, one
// integer dot per block where two 4-bit terms (high and low nibbles of u) took two. Codes
// [N/16, K/32, 8, 16, 4] uint8: register j (0..7) of a block holding each output's weights
// 4j .. 4j + 3; params as above. The AVX-512 VNNI and AVX2 builds run it vectorized (AVX2 on
// the signed codes: dot_half_q8_avx2); a build without either runs a scalar loop (correct, slow:
// kspec picks the 8-bit form only on a vectorized build, engine/models/cpu_fast.py).
//
// The 5-bit form (q5_q8_matmul: GGUF Q5_0 / Q5_1 / Q5_K weights, codes u in 0..31) is the 8-bit
// form's arithmetic over 5 bits a weight: codes [N/16, K/32, 5, 16, 4] uint8, registers 0..3 the
// low 4 bits as the 4-bit form holds its codes, register 4 eight 64-bit masks, mask j's bit
// 4 n + i the fifth bit of output n's weight 4j + i. The VNNI loop unpacks the nibbles as the
// 4-bit form does and adds 16 where a mask says (one masked byte add per register): 320 bytes
// a tile and block where the 8-bit form reads 512. Built vectorized for AVX-512 VNNI only; other
// builds run the scalar loop, and kspec keeps such weights in the 8-bit form there
// (engine/models/cpu_fast.py Q5Q8_ISAS).
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

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define KSPEC_Q4Q8_AVX2 1
#endif
#if KSPEC_Q4Q8_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define KSPEC_Q4Q8_VNNI 1
#endif

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

// Bytes of one tile's codes per block: 16 outputs x 32 weights, 4-bit codes two a byte; 5-bit ones
// as the 4-bit codes and a 64-byte register of their fifth bits
template <int Bits>
constexpr int64_t kTileBytes = kTile * Bits * kBlock / 8;  // 256, 320 or 512

// 64-byte registers of one tile's codes per block, each holding 4 bytes of every one of its 16 outputs
template <int Bits>
constexpr int64_t kTileRegisters = kTileBytes<Bits> / 64;  // 4, 5 or 8

// The fifth-bit mask of register j (weights 4j .. 4j + 3 of each output) of a 5-bit tile's block
inline uint64_t fifth_bits(const uint8_t* block_codes, int64_t j) {
  uint64_t mask;
  std::memcpy(&mask, block_codes + 4 * 64 + 8 * j, sizeof mask);
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

#if KSPEC_Q4Q8_AVX2
// An empty instruction that "changes" two sums: the compiler must hold them, as summed so far, in
// registers here, so it neither reorders a chain of integer adds into a tree nor computes a block's
// products ahead of their adds (which spilled them all to the stack: GCC 12 at -O3)
inline void keep_in_registers(__m256i& a, __m256i& b) { asm volatile("" : "+x"(a), "+x"(b)); }
inline void keep_in_register(__m256i& a) { asm volatile("" : "+x"(a)); }
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
};

// One block of 32 activations: a = round(x / d) (to nearest even, as std::nearbyint), d = max|x| / 127
inline void quantize_block(const float* xb, int8_t* ab, float& d, float& total, float& code_sum) {
#if KSPEC_Q4Q8_VNNI
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  total = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
  d = amax / 127.f;
  const __m512 inv = _mm512_set1_ps(d > 0.f ? 1.f / d : 0.f);
  const __m512i a0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512i a1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ab), _mm512_cvtepi32_epi8(a0));  // |a| <= 127: no saturation
  _mm_storeu_si128(reinterpret_cast<__m128i*>(ab + 16), _mm512_cvtepi32_epi8(a1));
  code_sum = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1)));
#else
  float amax = 0.f;
  total = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : total)
  for (int64_t j = 0; j < kBlock; ++j) {
    amax = std::max(amax, std::fabs(xb[j]));
    total += xb[j];
  }
  d = amax / 127.f;
  const float inv = d > 0.f ? 1.f / d : 0.f;
  int32_t codes = 0;
#pragma omp simd reduction(+ : codes)
  for (int64_t j = 0; j < kBlock; ++j) {
    ab[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
    codes += ab[j];
  }
  code_sum = d * static_cast<float>(codes);
#endif
}

constexpr int64_t kQuantizeGrain = 256;  // blocks per thread's share: below, one thread quantizes

Quantized quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = rows * (k / kBlock);
  Quantized q{uninitialized<int8_t>(rows * k), uninitialized<float>(blocks), uninitialized<float>(blocks),
              uninitialized<float>(blocks)};
  at::parallel_for(0, blocks, kQuantizeGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      quantize_block(x + i * kBlock, q.a.get() + i * kBlock, q.scale[i], q.sum[i], q.code_sum[i]);
  });
  return q;
}

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

#if KSPEC_Q4Q8_VNNI
// AVX-512 VNNI: T tiles (16 T outputs) x R rows. A block's codes unpack into 8 registers per
// tile (weights 4j .. 4j + 3 of each output in its lane), used by every row; a row's 8 broadcast
// groups of four activations serve every tile. Per row, tile and block: 8 vpdpbusd into a fresh
// int32 sum (exact: 32 * 255 * 127 < 2^31), then y += s d float(sum) + m sum_x. With few sums
// (T R <= 2) each block's integer sum is split in two chains so that the loop is not bound by one
// chain of 8 dependent vpdpbusd.
template <int Bits, int T, int R>
void dot_tiles_vnni(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k,
                    int64_t t0, float* y, int64_t ldy) {
  static_assert(T >= 1 && T <= 4 && R >= 1 && R <= 8 && (Bits == 4 || Bits == 5 || Bits == 8));
  constexpr int kChains = T * R <= 2 ? 2 : 1;
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;                // [R, blocks]
  const float* xs = minimum_sums<Bits>(q).get() + r0 * blocks;  // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i sixteen = _mm512_set1_epi8(16);
  __m512 acc[T][R];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i w[T][8];
    __m512 scales[T], mins[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const uint8_t* tc = codes + ((t0 + t) * blocks + b) * kTileBytes<Bits>;  // [4, 16, 4] or [8, 16, 4]
      const c10::Half* tp = params + ((t0 + t) * blocks + b) * kParamsPerBlock;  // [2, 16]
      prefetch_block<Bits>(tc, tp, kPrefetchBlocks);
      if constexpr (Bits == 4 || Bits == 5) {
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
          const __m512i packed = _mm512_loadu_si512(tc + 64 * p);
          w[t][p] = _mm512_and_si512(packed, low_mask);                           // weights 4p ..
          w[t][p + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);  // weights 16 + 4p ..
        }
        if constexpr (Bits == 5) {
#pragma GCC unroll 8
          for (int j = 0; j < 8; ++j) w[t][j] = _mm512_mask_add_epi8(w[t][j], _cvtu64_mask64(fifth_bits(tc, j)), w[t][j], sixteen);
        }
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) w[t][j] = _mm512_loadu_si512(tc + 64 * j);
      }
      scales[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp)));
      mins[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp + kTile)));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m512i dots[kChains][T];
#pragma GCC unroll 2
      for (int c = 0; c < kChains; ++c)
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) dots[c][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i four = _mm512_set1_epi32(four_bytes(a + 4 * j));
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) dots[j % kChains][t] = _mm512_dpbusd_epi32(dots[j % kChains][t], w[t][j], four);
      }
      const __m512 d = _mm512_set1_ps(xd[r * blocks + b]);
      const __m512 sum_x = _mm512_set1_ps(xs[r * blocks + b]);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i dot = kChains == 2 ? _mm512_add_epi32(dots[0][t], dots[kChains - 1][t]) : dots[0][t];
        const __m512 with_mins = _mm512_fmadd_ps(mins[t], sum_x, acc[t][r]);
        acc[t][r] = _mm512_fmadd_ps(_mm512_mul_ps(scales[t], d), _mm512_cvtepi32_ps(dot), with_mins);
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * ldy + (t0 + t) * kTile, acc[t][r]);
}

// Every row of tiles t0 .. t0 + T - 1, R_MAX rows at a time
template <int Bits, int T, int RMax>
void dot_rows_vnni(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                   int64_t t0, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + RMax <= rows; r += RMax) dot_tiles_vnni<Bits, T, RMax>(q, r, codes, params, k, t0, y, ldy);
  switch (rows - r) {
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

// Tiles t0 .. t1 - 1, one at a time over 8 rows (its unpacked codes and 8 sums in registers;
// measured: two tiles at a time at one or two rows 1.1-1.3x slower)
template <int Bits>
void dot_range_vnni(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                    int64_t t0, int64_t t1, float* y, int64_t ldy) {
  for (int64_t t = t0; t < t1; ++t) dot_rows_vnni<Bits, 1, 8>(q, rows, codes, params, k, t, y, ldy);
}
#endif

#if KSPEC_Q4Q8_AVX2 && !KSPEC_Q4Q8_VNNI
// One 4-bit block's share of 8 outputs for one row: the block's int16 pair sums (maddubs) to
// int32 dots, then acc + s d dot + m sum_x
inline __m256 add_block_avx2(__m256 acc, __m256i pairs, __m256 scales, __m256 mins, float d, float sum_x) {
  const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  return _mm256_fmadd_ps(_mm256_mul_ps(scales, _mm256_set1_ps(d)), dot, _mm256_fmadd_ps(mins, _mm256_set1_ps(sum_x), acc));
}

// AVX2, 4-bit codes: half a tile (8 outputs, the low or high 32 bytes of each of the block's
// four 64-byte registers) x R rows. maddubs of the unsigned codes and 4 broadcast signed
// activations gives two int16 pair sums per lane (2 * 15 * 127); the block's 8 of them add in
// int16 without saturating (8 * 3810 < 2^15), then one madd with ones makes each output's int32 dot.
template <int R>
void dot_half_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t t,
                   int half, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* xs = q.sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_codes = codes + (t * blocks + b) * kTileBytes<4>;    // [4, 16, 4]
    const c10::Half* block_params = params + (t * blocks + b) * kParamsPerBlock;  // [2, 16]
    if (half == 0) prefetch_block<4>(block_codes, block_params, kPrefetchBlocksAvx2);  // half 1 finds them cached
    const uint8_t* tc = block_codes + 32 * half;    // 4 x 32 bytes, 64 apart
    const c10::Half* tp = block_params + 8 * half;  // s at 0, m at 16
    __m256i packed[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) packed[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * p));
    const __m256 scales = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp)));
    const __m256 mins = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + kTile)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m256i pairs = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m256i lo = _mm256_and_si256(packed[p], low_mask);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed[p], 4), low_mask);
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four_bytes(a + 4 * p))));
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four_bytes(a + 16 + 4 * p))));
        keep_in_register(pairs);
      }
      acc[r] = add_block_avx2(acc[r], pairs, scales, mins, xd[r * blocks + b], xs[r * blocks + b]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * ldy + t * kTile + 8 * half, acc[r]);
}

// AVX2, 4-bit codes, a whole tile (16 outputs: both halves of each 64-byte register) x R rows,
// for one or two rows: each code line read once, each broadcast of activations used for both
// halves (Zen 3, the 120 projections against half tiles: 1.33x at one row, 1.37x at two; in pairs
// of rows 1.16x at four but 0.99x at eight and 0.84x at forty, where the half tiles' unpacked codes
// serve 4 rows from registers)
template <int R>
void dot_full_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t t,
                   float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* xs = q.sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* tc = codes + (t * blocks + b) * kTileBytes<4>;    // [4, 16, 4]
    const c10::Half* tp = params + (t * blocks + b) * kParamsPerBlock;  // [2, 16]
    prefetch_block<4>(tc, tp, kPrefetchBlocksAvx2);
    __m256 scales[2], mins[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      scales[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + 8 * h)));
      mins[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + kTile + 8 * h)));
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m256i pairs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m256i low_x = _mm256_set1_epi32(four_bytes(a + 4 * p)), high_x = _mm256_set1_epi32(four_bytes(a + 16 + 4 * p));
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * p + 32 * h));
          const __m256i lo = _mm256_and_si256(packed, low_mask);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);
          pairs[h] = _mm256_add_epi16(pairs[h], _mm256_maddubs_epi16(lo, low_x));
          pairs[h] = _mm256_add_epi16(pairs[h], _mm256_maddubs_epi16(hi, high_x));
        }
        keep_in_registers(pairs[0], pairs[1]);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) acc[r][h] = add_block_avx2(acc[r][h], pairs[h], scales[h], mins[h], xd[r * blocks + b], xs[r * blocks + b]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + (r0 + r) * ldy + t * kTile + 8 * h, acc[r][h]);
}

// AVX2, 4-bit codes, many rows: a tile's codes for a run of blocks unpacked once into 8-bit
// codes (and its float16 s and m into float32) in a scratch that stays in L1, then every row
// reads them from there. The unpacking (3 instructions per 32 codes) and the registers that held
// unpacked codes across rows were what bounded the half tiles at 4 and more rows; from the
// scratch a code register is a plain load, so R rows x both halves of the tile take their
// maddubs back to back: per block and row 16 maddubs and 16 adds for 16 outputs, then the float
// fold of each half (madd, cvt, mul, 2 fma).
constexpr int64_t kUnpackedChunk = 8;  // blocks unpacked at a time: 8 x 640 bytes of scratch
constexpr int64_t kUnpackedRows = 6;   // rows at a time: 12 int16 sums, 2 codes and a broadcast in 16 registers
constexpr int64_t kUnpackedFromRows = 5;  // fewer rows keep the half tiles (Zen 3: equal at 3 and 4 rows, 1.03x slower at 5)

struct UnpackedBlock {  // one block of a tile, 8-bit codes [8, 16, 4] (weights 4j .. 4j + 3 in register j) and its params
  alignas(64) uint8_t codes[8][kTile * 4];
  alignas(64) float scales[kTile];
  alignas(64) float mins[kTile];
};

// Blocks b0 .. b0 + n - 1 of tile t into scratch: register p's low nibbles become register p,
// its high nibbles register p + 4 (weights 16 + 4p .. 16 + 4p + 3, which meet activations 4 (p + 4))
inline void unpack_tile_avx2(const uint8_t* codes, const c10::Half* params, int64_t blocks, int64_t t, int64_t b0,
                             int64_t n, UnpackedBlock* scratch) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* tc = codes + (t * blocks + b0 + i) * kTileBytes<4>;      // [4, 16, 4]
    const c10::Half* tp = params + (t * blocks + b0 + i) * kParamsPerBlock;  // [2, 16]
    prefetch_block<4>(tc, tp, kPrefetchBlocksAvx2);
    UnpackedBlock& u = scratch[i];
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) {  // 32-byte pieces: register h / 2, half h % 2
      const int p = h / 2, half = h % 2;
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * p + 32 * half));
      _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[p] + 32 * half), _mm256_and_si256(packed, low_mask));
      _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[p + 4] + 32 * half),
                         _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask));
    }
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      _mm256_store_ps(u.scales + 8 * half, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + 8 * half))));
      _mm256_store_ps(u.mins + 8 * half, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + kTile + 8 * half))));
    }
  }
}

// R rows from r0 of tile t over the n unpacked blocks from b0, added to y's 16 outputs of each
// row (zeroed before the first chunk). Only the R x 2 int16 sums live in registers through a
// block, so that two loaded code registers serve all R rows; the float fold goes to y (in L1).
template <int R>
void dot_unpacked_avx2(const Quantized& q, int64_t r0, const UnpackedBlock* scratch, int64_t b0, int64_t n, int64_t k,
                       int64_t t, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* xs = q.sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  float* y0 = y + r0 * ldy + t * kTile;
  for (int64_t i = 0; i < n; ++i) {
    const UnpackedBlock& u = scratch[i];
    const int64_t b = b0 + i;
    __m256i pairs[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.codes[j]));
      const __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.codes[j] + 32));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256i x = _mm256_set1_epi32(four_bytes(a0 + r * k + b * kBlock + 4 * j));
        keep_in_register(x);
        pairs[r][0] = _mm256_add_epi16(pairs[r][0], _mm256_maddubs_epi16(c0, x));
        pairs[r][1] = _mm256_add_epi16(pairs[r][1], _mm256_maddubs_epi16(c1, x));
        keep_in_registers(pairs[r][0], pairs[r][1]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        float* out = y0 + r * ldy + 8 * h;
        _mm256_storeu_ps(out, add_block_avx2(_mm256_loadu_ps(out), pairs[r][h], _mm256_load_ps(u.scales + 8 * h),
                                             _mm256_load_ps(u.mins + 8 * h), xd[r * blocks + b], xs[r * blocks + b]));
      }
  }
}

// A group of 3 .. kUnpackedRows rows from r0 (kUnpackedFromRows or more rows split evenly into
// groups of at most 6 leave at least 3 in each)
inline void dot_unpacked_rows_avx2(int64_t rows, const Quantized& q, int64_t r0, const UnpackedBlock* scratch, int64_t b0,
                                   int64_t n, int64_t k, int64_t t, float* y, int64_t ldy) {
  switch (rows) {
    case 6: dot_unpacked_avx2<6>(q, r0, scratch, b0, n, k, t, y, ldy); break;
    case 5: dot_unpacked_avx2<5>(q, r0, scratch, b0, n, k, t, y, ldy); break;
    case 4: dot_unpacked_avx2<4>(q, r0, scratch, b0, n, k, t, y, ldy); break;
    default: dot_unpacked_avx2<3>(q, r0, scratch, b0, n, k, t, y, ldy); break;
  }
}

// Tile t, every row: its codes kUnpackedChunk blocks at a time into the scratch, then the rows
// in as few groups of at most kUnpackedRows as cover them, their sizes differing by at most one
// (8 rows as 4 + 4, not 6 + 2: a group of few rows loads the codes for few maddubs)
void dot_tile_unpacked_avx2(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                            int64_t t, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = (rows + kUnpackedRows - 1) / kUnpackedRows, base = rows / groups, larger = rows % groups;
  UnpackedBlock scratch[kUnpackedChunk];
  for (int64_t r = 0; r < rows; ++r) std::memset(y + r * ldy + t * kTile, 0, kTile * sizeof(float));
  for (int64_t b0 = 0; b0 < blocks; b0 += kUnpackedChunk) {
    const int64_t n = std::min(kUnpackedChunk, blocks - b0);
    unpack_tile_avx2(codes, params, blocks, t, b0, n, scratch);
    for (int64_t g = 0, r = 0; g < groups; ++g) {
      const int64_t group_rows = base + (g < larger ? 1 : 0);
      dot_unpacked_rows_avx2(group_rows, q, r, scratch, b0, n, k, t, y, ldy);
      r += group_rows;
    }
  }
}

// AVX2, 8-bit codes: half a tile (8 outputs, the low or high 32 bytes of each of the block's
// eight 64-byte registers) x R rows. maddubs would saturate on the codes u = q + 128 (255 x 127
// pairs), so the codes flip back to the file's signed q (u xor 0x80) and maddubs takes |q|
// against the activations with q's sign (llama.cpp's AVX2 Q8_0 dot): each int16 pair sum is at
// most 2 * 127 * 127 < 2^15, and a madd with ones makes each output's int32 dot of four weights.
// So y = sum_b s d (q . a), the 8-bit form's sum without its m term (s (u . a) + m (a sum) with
// m = -128 s is the same integer sum, q . a). Zen 3, the default model's head against its two
// 4-bit terms (README "Measured").
template <int R>
void dot_half_q8_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t t,
                      int half, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_codes = codes + (t * blocks + b) * kTileBytes<8>;    // [8, 16, 4]
    const c10::Half* block_params = params + (t * blocks + b) * kParamsPerBlock;  // [2, 16]
    if (half == 0) prefetch_block<8>(block_codes, block_params, kPrefetchBlocksAvx2);  // half 1 finds them cached
    __m256i signed_codes[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      signed_codes[j] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_codes + 64 * j + 32 * half)), flip);
    const __m256 scales = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block_params + 8 * half)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m256i dot = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i magnitudes = _mm256_sign_epi8(signed_codes[j], signed_codes[j]);  // |q| <= 127
        const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(four_bytes(a + 4 * j)), signed_codes[j]);
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed_x), ones));
        keep_in_register(dot);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(scales, _mm256_set1_ps(xd[r * blocks + b])), _mm256_cvtepi32_ps(dot), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * ldy + t * kTile + 8 * half, acc[r]);
}

// Half a tile of either form, R rows
template <int Bits, int R>
void dot_half_form_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t t,
                        int half, float* y, int64_t ldy) {
  if constexpr (Bits == 4) dot_half_avx2<R>(q, r0, codes, params, k, t, half, y, ldy);
  else dot_half_q8_avx2<R>(q, r0, codes, params, k, t, half, y, ldy);
}

// Tile t, every row: for 4-bit codes a whole tile at one or two rows, the unpacked scratch from
// kUnpackedFromRows rows, else 4 rows at a time per half tile, then the rest
template <int Bits>
void dot_tile_avx2(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t t,
                   float* y, int64_t ldy) {
  if (Bits == 4 && rows >= kUnpackedFromRows) {
    dot_tile_unpacked_avx2(q, rows, codes, params, k, t, y, ldy);
    return;
  }
  if (Bits == 4 && rows <= 2) {
    if (rows == 2) dot_full_avx2<2>(q, 0, codes, params, k, t, y, ldy);
    else dot_full_avx2<1>(q, 0, codes, params, k, t, y, ldy);
    return;
  }
  for (int half = 0; half < 2; ++half) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) dot_half_form_avx2<Bits, 4>(q, r, codes, params, k, t, half, y, ldy);
    switch (rows - r) {
      case 3: dot_half_form_avx2<Bits, 3>(q, r, codes, params, k, t, half, y, ldy); break;
      case 2: dot_half_form_avx2<Bits, 2>(q, r, codes, params, k, t, half, y, ldy); break;
      case 1: dot_half_form_avx2<Bits, 1>(q, r, codes, params, k, t, half, y, ldy); break;
      default: break;
    }
  }
}
#endif

// Tile t, every row, one sum at a time: either form where no vector loop is built
template <int Bits>
void dot_tile_scalar(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                     int64_t t, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < kTile; ++n) {
      float total = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* tc = codes + (t * blocks + b) * kTileBytes<Bits>;
        const c10::Half* tp = params + (t * blocks + b) * kParamsPerBlock;
        const int8_t* a = q.a.get() + r * k + b * kBlock;
        int32_t dot = 0;
        if constexpr (Bits == 5) {
          for (int64_t j = 0; j < 4; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              const uint8_t code = tc[(j * kTile + n) * 4 + i];
              const int32_t low = (code & 0x0F) + 16 * static_cast<int32_t>((fifth_bits(tc, j) >> (4 * n + i)) & 1);
              const int32_t high = (code >> 4) + 16 * static_cast<int32_t>((fifth_bits(tc, j + 4) >> (4 * n + i)) & 1);
              dot += low * a[4 * j + i] + high * a[16 + 4 * j + i];
            }
        } else {
          for (int64_t j = 0; j < kTileRegisters<Bits>; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              const uint8_t code = tc[(j * kTile + n) * 4 + i];
              if constexpr (Bits == 4)
                dot += (code & 0x0F) * a[4 * j + i] + (code >> 4) * a[16 + 4 * j + i];
              else
                dot += code * a[4 * j + i];
            }
        }
        const float s = static_cast<float>(tp[n]), m = static_cast<float>(tp[kTile + n]);
        total += s * q.scale[r * blocks + b] * static_cast<float>(dot) + m * minimum_sums<Bits>(q)[r * blocks + b];
      }
      y[r * ldy + t * kTile + n] = total;
    }
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "kspec q4_q8_matmul: ", what); }

// Checks shared by both forms; y [M, N] and x quantized, or y empty when there is nothing to do
template <int Bits>
std::tuple<Tensor, Quantized> prepare(const Tensor& x, const Tensor& codes, const Tensor& params) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [M, K] float32");
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0) * kTile;
  check(k % kBlock == 0, "K must be a multiple of 32");
  check(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 5 && codes.size(1) == k / kBlock &&
            codes.size(2) == kTileRegisters<Bits> && codes.size(3) == kTile && codes.size(4) == 4,
        Bits == 4   ? "codes must be [N/16, K/32, 4, 16, 4] uint8, contiguous"
        : Bits == 5 ? "codes must be [N/16, K/32, 5, 16, 4] uint8, contiguous"
                    : "codes must be [N/16, K/32, 8, 16, 4] uint8, contiguous");
  check(params.scalar_type() == at::kHalf && params.is_contiguous() && params.dim() == 4 &&
            params.size(0) == codes.size(0) && params.size(1) == k / kBlock && params.size(2) == 2 && params.size(3) == kTile,
        "params must be [N/16, K/32, 2, 16] float16, contiguous");
  Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return {y, Quantized{}};
  return {y, quantize_rows(x.data_ptr<float>(), rows, k)};
}

// Either form: y [M, N] from x and the weights in the form's layout, tiles of 16 outputs split
// between the threads (the VNNI loop where built, else the AVX2 one, else the scalar one)
template <int Bits>
Tensor matmul_form(const Tensor& x_in, const Tensor& codes, const Tensor& params) {
  const Tensor x = x_in.contiguous();
  auto [y, q] = prepare<Bits>(x, codes, params);
  const int64_t rows = y.size(0), k = x.size(1), n = y.size(1);
  if (rows == 0 || n == 0) return y;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const c10::Half* pp = params.data_ptr<c10::Half>();
  float* yp = y.template data_ptr<float>();
  at::parallel_for(0, n / kTile, 2, [&](int64_t t0, int64_t t1) {
#if KSPEC_Q4Q8_VNNI
    dot_range_vnni<Bits>(q, rows, cp, pp, k, t0, t1, yp, n);
#elif KSPEC_Q4Q8_AVX2
    if constexpr (Bits == 5) {  // no AVX2 loop for the 5-bit form
      for (int64_t t = t0; t < t1; ++t) dot_tile_scalar<Bits>(q, rows, cp, pp, k, t, yp, n);
    } else {
      for (int64_t t = t0; t < t1; ++t) dot_tile_avx2<Bits>(q, rows, cp, pp, k, t, yp, n);
    }
#else
    for (int64_t t = t0; t < t1; ++t) dot_tile_scalar<Bits>(q, rows, cp, pp, k, t, yp, n);
#endif
  });
  return y;
}

}  // namespace

// x [M, K] float32, codes [N/16, K/32, 4, 16, 4] uint8, params [N/16, K/32, 2, 16] float16 -> y [M, N] float32
Tensor q4_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<4>(x, codes, params); }

// x [M, K] float32, codes [N/16, K/32, 8, 16, 4] uint8 (q + 128), params [N/16, K/32, 2, 16] float16 -> y [M, N] float32
Tensor q8_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<8>(x, codes, params); }

// x [M, K] float32, codes [N/16, K/32, 5, 16, 4] uint8 (the low 4 bits, then the fifth bits' masks), params as above -> y [M, N] float32
Tensor q5_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<5>(x, codes, params); }

// The instructions this build multiplies with (kernels/cpu_layers.py matmul_isa)
std::string q4_q8_isa() {
#if KSPEC_Q4Q8_VNNI
  return "avx512-vnni";
#elif KSPEC_Q4Q8_AVX2
  return "avx2";
#else
  return "scalar";
#endif
}

TORCH_LIBRARY_FRAGMENT(kspec, m) {
  m.def("q4_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q8_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q5_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q4_q8_isa() -> str", q4_q8_isa);
}

TORCH_LIBRARY_IMPL(kspec, CPU, m) {
  m.impl("q4_q8_matmul", q4_q8_matmul);
  m.impl("q8_q8_matmul", q8_q8_matmul);
  m.impl("q5_q8_matmul", q5_q8_matmul);
}
