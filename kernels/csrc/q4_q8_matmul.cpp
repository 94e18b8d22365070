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
// Layout, in groups of 4 weight rows (outputs) so that a group's blocks are one stream of 64-byte
// lines: codes [N/4, K/32, 4, 16] uint8, a block's 16 bytes with weight j in the low nibble of
// byte j and j + 16 in the high nibble (GGUF's order); params [N/4, 2, K/32, 4] float16 (every
// s of the group, then every m).
//
// The 8-bit form (q8_q8_matmul: a GGUF Q8_0 weight, w = d q with q in -127..127, the default
// model's tied head) is the same loop over whole-byte codes u = q + 128 in 0..255:
//
//   y[r,n] = sum_b  s[n,b] d[r,b] (sum_j u[j] a[j])  +  m[n,b] d[r,b] (sum_j a[j])
//
// with s = d and m = -128 d, i.e. sum_b d[n,b] d[r,b] (q . a): llama.cpp's Q8_0 x Q8_0 dot, one
// integer dot per block where two 4-bit terms (high and low nibbles of u) took two. Codes
// [N/4, K/32, 2, 4, 16] uint8: weights 0..15 of the 4 outputs, then 16..31 (each half one
// 64-byte line, as the 4-bit form's low and high nibbles); params as above. The AVX-512 VNNI
// build runs it vectorized; other builds run a scalar loop (correct, slow: kspec picks the
// 8-bit form only on a VNNI build, engine/models/cpu_fast.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

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
constexpr int64_t kGroupRows = 4;       // weight rows stored interleaved, multiplied together
constexpr int64_t kPrefetchBlocks = 8;  // blocks (of 4 rows, 64 bytes) read ahead

struct Quantized {  // x [M, K] as 8-bit blocks
  std::vector<int8_t> a;       // [M, K]
  std::vector<float> scale;    // [M, K/32] d
  std::vector<float> sum;      // [M, K/32] float32 sum of the block's x (the 4-bit form's minimums)
  std::vector<float> code_sum; // [M, K/32] d * sum of the block's a (the 8-bit form's -128 d)
};

Quantized quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = k / kBlock;
  Quantized q{std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks),
              std::vector<float>(rows * blocks)};
  for (int64_t i = 0; i < rows * blocks; ++i) {
    const float* xb = x + i * kBlock;
    float amax = 0.f, total = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : total)
    for (int64_t j = 0; j < kBlock; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      total += xb[j];
    }
    const float d = amax / 127.f;
    const float inv = d > 0.f ? 1.f / d : 0.f;
    int8_t* ab = q.a.data() + i * kBlock;
    int32_t codes = 0;
#pragma omp simd reduction(+ : codes)
    for (int64_t j = 0; j < kBlock; ++j) {
      ab[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
      codes += ab[j];
    }
    q.scale[i] = d;
    q.sum[i] = total;
    q.code_sum[i] = d * static_cast<float>(codes);
  }
  return q;
}

// float16 -> float32 of n values (n even)
inline void halves_to_floats(const c10::Half* h, float* f, int64_t n) {
  int64_t i = 0;
#if KSPEC_Q4Q8_AVX2
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
  for (; i < n; ++i) f[i] = static_cast<float>(h[i]);
}

constexpr int64_t kMaxBlocks = 1024;  // K up to 32768

// Bytes of one output's codes per block: 4-bit codes two a byte, 8-bit ones a byte each
template <int Bits>
constexpr int64_t kCodeBytes = Bits * kBlock / 8;

// The per-block sums of x each form's m multiplies: sum(x) for 4 bits, d sum(a) for 8
template <int Bits>
const std::vector<float>& minimum_sums(const Quantized& q) {
  return Bits == 4 ? q.sum : q.code_sum;
}

// One group of 4 weight rows with its float16 parameters in float32, converted once for every
// row tile that multiplies it
struct GroupWeights {
  const uint8_t* codes;                    // [blocks, 4, 16]
  float scales[kMaxBlocks * kGroupRows];   // [blocks, 4]
  float mins[kGroupRows * kMaxBlocks];     // [4, blocks]: one output's minimums contiguous
};

void load_group(const uint8_t* codes, const c10::Half* params, int64_t blocks, int64_t g, GroupWeights& w) {
  w.codes = codes + g * blocks * kGroupRows * 16;
  const c10::Half* gp = params + g * 2 * blocks * kGroupRows;
  halves_to_floats(gp, w.scales, blocks * kGroupRows);
  float mins[kMaxBlocks * kGroupRows];  // [blocks, 4]
  halves_to_floats(gp + blocks * kGroupRows, mins, blocks * kGroupRows);
  for (int c = 0; c < kGroupRows; ++c)
    for (int64_t b = 0; b < blocks; ++b) w.mins[c * blocks + b] = mins[b * kGroupRows + c];
}

#if KSPEC_Q4Q8_VNNI
// AVX-512 VNNI: a block's 64 bytes (4 outputs x 16) are one register; its low nibbles are
// weights 0..15 of each output, its high nibbles 16..31. Against the row's activations 0..15
// and 16..31, each broadcast to the four 128-bit lanes, two vpdpbusd give 4 int32 partial sums
// per output (exact: 4 * 15 * 127 per lane), scaled by s[n, b] d[r, b] into float32 sums; the
// minimums' term m[n, b] sum(x[r, b]) goes into each output's first lane. The block's float16
// parameters are converted in the loop (no pass over the group first). G groups (4 G outputs)
// x R rows at once: the unpacked blocks serve every row, and a row's activation and scale loads
// (the loop's bound with one group: four loads to six arithmetic operations) serve every group.
// 8-bit codes (Bits = 8) are two 64-byte registers a block instead of one register's nibbles.
template <int Bits, int G, int R>
void dot_groups_vnni(const Quantized& q, int64_t r0, const uint8_t* codes, const c10::Half* params, int64_t k,
                     int64_t g, float* y, int64_t ldy) {
  static_assert(G >= 1 && G <= 2 && R >= 1 && R <= 8 && (Bits == 4 || Bits == 8));
  constexpr int64_t block_bytes = kGroupRows * kCodeBytes<Bits>;  // 64 or 128
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.data() + r0 * blocks;                  // [R, blocks]
  const float* xs = minimum_sums<Bits>(q).data() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.data() + r0 * k;
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  const __m512i output_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  constexpr __mmask16 first_lanes = 0x1111;
  // With one row, two sums per group over alternate blocks: one sum's chain of two dependent
  // fused multiply-adds per block would bound the loop.
  constexpr int kChains = G * R <= 2 ? 2 : 1;
  __m512 acc[kChains][G][R];
#pragma GCC unroll 16
  for (int c = 0; c < kChains; ++c)
#pragma GCC unroll 16
    for (int i = 0; i < G; ++i)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[c][i][r] = _mm512_setzero_ps();
  auto block = [&](int64_t b, __m512 (*sums)[R]) __attribute__((always_inline)) {
    __m512i lo[G], hi[G];
    __m512 scales[G], mins[G];
#pragma GCC unroll 2
    for (int i = 0; i < G; ++i) {
      const uint8_t* gc = codes + (g + i) * blocks * block_bytes;  // [blocks, 4, 16] or [blocks, 2, 4, 16]
      const c10::Half* gs = params + (g + i) * 2 * blocks * kGroupRows;  // [blocks, 4] scales, then minimums
      const uint8_t* ahead = gc + (b + kPrefetchBlocks) * block_bytes;
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
      if constexpr (Bits == 4) {
        const __m512i packed = _mm512_loadu_si512(gc + b * block_bytes);  // [4 outputs, 16 bytes]
        lo[i] = _mm512_and_si512(packed, low_mask);
        hi[i] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T0);
        lo[i] = _mm512_loadu_si512(gc + b * block_bytes);       // [4 outputs, weights 0..15]
        hi[i] = _mm512_loadu_si512(gc + b * block_bytes + 64);  // [4 outputs, weights 16..31]
      }
      const __m128 s4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(gs + b * kGroupRows)));
      const __m128 m4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(gs + (blocks + b) * kGroupRows)));
      scales[i] = _mm512_permutexvar_ps(output_of_lane, _mm512_castps128_ps512(s4));  // s[n, b] in n's 4 lanes
      mins[i] = _mm512_maskz_permutexvar_ps(first_lanes, output_of_lane, _mm512_castps128_ps512(m4));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      const __m512i a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
      const __m512i a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 16)));
      const __m512 d = _mm512_set1_ps(xd[r * blocks + b]);
      const __m512 sum_x = _mm512_set1_ps(xs[r * blocks + b]);
#pragma GCC unroll 2
      for (int i = 0; i < G; ++i) {
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], a_lo), hi[i], a_hi);
        const __m512 with_mins = _mm512_fmadd_ps(mins[i], sum_x, sums[i][r]);
        sums[i][r] = _mm512_fmadd_ps(_mm512_mul_ps(scales[i], d), _mm512_cvtepi32_ps(dots), with_mins);
      }
    }
  };
  int64_t b = 0;
  for (; b + kChains <= blocks; b += kChains)
#pragma GCC unroll 2
    for (int c = 0; c < kChains; ++c) block(b + c, acc[c]);
  for (; b < blocks; ++b) block(b, acc[0]);
  for (int i = 0; i < G; ++i)
    for (int r = 0; r < R; ++r) {
      __m512 total = acc[0][i][r];
      if constexpr (kChains == 2) total = _mm512_add_ps(total, acc[1][i][r]);
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, total);
      float* out = y + (r0 + r) * ldy + (g + i) * kGroupRows;
      for (int c = 0; c < kGroupRows; ++c) out[c] = (lanes[4 * c] + lanes[4 * c + 1]) + (lanes[4 * c + 2] + lanes[4 * c + 3]);
    }
}

// Two groups share each row's loads from this many rows on (below, one group's loop is not
// bound by its loads; measured on Zen 5: 2 and 4 rows 1.1-1.2x slower paired, 8 rows on faster)
constexpr int64_t kPairedRows = 8;

// y[:, 4 g .. 4 (g + G) - 1], 8 rows at a time
template <int Bits, int G>
void dot_rows_vnni(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t g,
                   float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) dot_groups_vnni<Bits, G, 8>(q, r, codes, params, k, g, y, ldy);
  switch (rows - r) {
    case 7: dot_groups_vnni<Bits, G, 7>(q, r, codes, params, k, g, y, ldy); break;
    case 6: dot_groups_vnni<Bits, G, 6>(q, r, codes, params, k, g, y, ldy); break;
    case 5: dot_groups_vnni<Bits, G, 5>(q, r, codes, params, k, g, y, ldy); break;
    case 4: dot_groups_vnni<Bits, G, 4>(q, r, codes, params, k, g, y, ldy); break;
    case 3: dot_groups_vnni<Bits, G, 3>(q, r, codes, params, k, g, y, ldy); break;
    case 2: dot_groups_vnni<Bits, G, 2>(q, r, codes, params, k, g, y, ldy); break;
    case 1: dot_groups_vnni<Bits, G, 1>(q, r, codes, params, k, g, y, ldy); break;
    default: break;
  }
}

// y[:, 4 g .. 4 g + 3] of G groups at a time where rows pair them (see kPairedRows)
template <int Bits>
void dot_range_vnni(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                    int64_t g0, int64_t g1, float* y, int64_t ldy) {
  int64_t g = g0;
  if (rows >= kPairedRows)
    for (; g + 2 <= g1; g += 2) dot_rows_vnni<Bits, 2>(q, rows, codes, params, k, g, y, ldy);
  for (; g < g1; ++g) dot_rows_vnni<Bits, 1>(q, rows, codes, params, k, g, y, ldy);
}
#endif

// y[:, 4 g .. 4 g + 3] from 8-bit codes, one sum at a time: the 8-bit form off a VNNI build
void dot_rows_q8_scalar(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k,
                        int64_t g, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const uint8_t* gc = codes + g * blocks * kGroupRows * kCodeBytes<8>;  // [blocks, 2, 4, 16]
  const c10::Half* gs = params + g * 2 * blocks * kGroupRows;           // [blocks, 4] scales, then minimums
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kGroupRows; ++c) {
      float total = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int8_t* a = q.a.data() + r * k + b * kBlock;
        int32_t dot = 0;
        for (int64_t half = 0; half < 2; ++half) {
          const uint8_t* u = gc + ((b * 2 + half) * kGroupRows + c) * 16;
          for (int64_t j = 0; j < 16; ++j) dot += u[j] * a[half * 16 + j];
        }
        const float s = static_cast<float>(gs[b * kGroupRows + c]), m = static_cast<float>(gs[(blocks + b) * kGroupRows + c]);
        total += s * q.scale[r * blocks + b] * static_cast<float>(dot) + m * q.code_sum[r * blocks + b];
      }
      y[r * ldy + g * kGroupRows + c] = total;
    }
}

// y[r, 4 g + c0 .. 4 g + c0 + C - 1] for rows r0 .. r0 + R - 1: C x R independent sums (at
// most 8, in registers), so that no fused multiply-add waits on the one before it; the block
// scales are multiplied inside the loop (computing them in a pass before cost as much as the
// loop itself at K = 576: 18 blocks)
template <int C, int R>
void dot_group(const Quantized& q, int64_t r0, const GroupWeights& w, int64_t k, int64_t g, int c0, float* y,
               int64_t ldy) {
  static_assert(C * R <= 8 && C <= kGroupRows);
  const int64_t blocks = k / kBlock;
  const uint8_t* gc = w.codes;
  const float* scales = w.scales;
  const float* xd = q.scale.data() + r0 * blocks;  // [R, blocks]
  float out[C][R] = {};
#if KSPEC_Q4Q8_AVX2
  __m256 acc[C][R];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  const int8_t* a0 = q.a.data() + r0 * k;
  for (int64_t b = 0; b < blocks; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(gc + (b + kPrefetchBlocks) * kGroupRows * 16), _MM_HINT_T0);
    __m256 row_scale[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) row_scale[r] = _mm256_broadcast_ss(xd + r * blocks + b);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(gc + (b * kGroupRows + c0 + c) * 16));
      const __m128i low_mask = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(packed, low_mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
      const __m256i w = _mm256_set_m128i(hi, lo);  // q[0..31] in order
      const __m256 ws = _mm256_broadcast_ss(&scales[b * kGroupRows + c0 + c]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a0 + r * k + b * kBlock));
        const __m256i pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));  // [8] int32
        acc[c][r] = _mm256_fmadd_ps(_mm256_mul_ps(ws, row_scale[r]), _mm256_cvtepi32_ps(pairs), acc[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) {
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc[c][r]), _mm256_extractf128_ps(acc[c][r], 1));
      const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
      out[c][r] = _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
    }
#else
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* wc = gc + (b * kGroupRows + c0 + c) * 16;
        const int8_t* a = q.a.data() + (r0 + r) * k + b * kBlock;
        int32_t dot = 0;
        for (int64_t j = 0; j < 16; ++j) dot += (wc[j] & 0x0F) * a[j] + (wc[j] >> 4) * a[j + 16];
        out[c][r] += scales[b * kGroupRows + c0 + c] * xd[r * blocks + b] * static_cast<float>(dot);
      }
#endif
  for (int c = 0; c < C; ++c) {
    const float* m = w.mins + (c0 + c) * blocks;
    for (int r = 0; r < R; ++r) {
      const float* xs = q.sum.data() + (r0 + r) * blocks;
      float total = 0.f;  // sum_b m[n, b] * sum(x[r, b])
#pragma omp simd reduction(+ : total)
      for (int64_t b = 0; b < blocks; ++b) total += m[b] * xs[b];
      y[(r0 + r) * ldy + g * kGroupRows + c0 + c] = out[c][r] + total;
    }
  }
}

// y[:, 4 g .. 4 g + 3]: rows 4 at a time over half the group's outputs, the rest 1 or 2 at a
// time over all four (the unpacked weights serve more rows; 8 sums fit the registers)
void dot_rows(const Quantized& q, int64_t rows, const uint8_t* codes, const c10::Half* params, int64_t k, int64_t g,
              float* y, int64_t ldy) {
  GroupWeights w;
  load_group(codes, params, k / kBlock, g, w);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    for (int c0 = 0; c0 < kGroupRows; c0 += 2) dot_group<2, 4>(q, r, w, k, g, c0, y, ldy);
  if (rows - r == 3) {
    for (int c0 = 0; c0 < kGroupRows; c0 += 2) dot_group<2, 3>(q, r, w, k, g, c0, y, ldy);
  } else if (rows - r == 2) {
    dot_group<4, 2>(q, r, w, k, g, 0, y, ldy);
  } else if (rows - r == 1) {
    dot_group<4, 1>(q, r, w, k, g, 0, y, ldy);
  }
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "kspec q4_q8_matmul: ", what); }

// Checks shared by both forms; y [M, N] and x quantized, or y empty when there is nothing to do
template <int Bits>
std::tuple<Tensor, Quantized> prepare(const Tensor& x, const Tensor& codes, const Tensor& params) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [M, K] float32");
  const int64_t rows = x.size(0), k = x.size(1), n = codes.size(0) * kGroupRows;
  check(k % kBlock == 0 && k / kBlock <= kMaxBlocks, "K must be a multiple of 32, at most 32768");
  const bool codes_fit = Bits == 4 ? codes.dim() == 4 && codes.size(1) == k / kBlock && codes.size(2) == kGroupRows && codes.size(3) == 16
                                   : codes.dim() == 5 && codes.size(1) == k / kBlock && codes.size(2) == 2 &&
                                         codes.size(3) == kGroupRows && codes.size(4) == 16;
  check(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes_fit,
        Bits == 4 ? "codes must be [N/4, K/32, 4, 16] uint8, contiguous" : "codes must be [N/4, K/32, 2, 4, 16] uint8, contiguous");
  check(params.scalar_type() == at::kHalf && params.is_contiguous() && params.dim() == 4 &&
            params.size(0) == codes.size(0) && params.size(1) == 2 && params.size(2) == k / kBlock && params.size(3) == kGroupRows,
        "params must be [N/4, 2, K/32, 4] float16, contiguous");
  Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return {y, Quantized{}};
  return {y, quantize_rows(x.data_ptr<float>(), rows, k)};
}

}  // namespace

namespace {

// Either form: y [M, N] from x and the weights in the form's layout, groups of 4 outputs split
// between the threads (the VNNI loop where built, else the form's portable one)
template <int Bits>
Tensor matmul_form(const Tensor& x_in, const Tensor& codes, const Tensor& params) {
  const Tensor x = x_in.contiguous();
  auto [y, q] = prepare<Bits>(x, codes, params);
  const int64_t rows = y.size(0), k = x.size(1), n = y.size(1);
  if (rows == 0 || n == 0) return y;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const c10::Half* pp = params.data_ptr<c10::Half>();
  float* yp = y.template data_ptr<float>();
  at::parallel_for(0, n / kGroupRows, 4, [&](int64_t g0, int64_t g1) {
#if KSPEC_Q4Q8_VNNI
    dot_range_vnni<Bits>(q, rows, cp, pp, k, g0, g1, yp, n);
#else
    for (int64_t g = g0; g < g1; ++g) (Bits == 4 ? dot_rows : dot_rows_q8_scalar)(q, rows, cp, pp, k, g, yp, n);
#endif
  });
  return y;
}

}  // namespace

// x [M, K] float32, codes [N/4, K/32, 4, 16] uint8, params [N/4, 2, K/32, 4] float16 -> y [M, N] float32
Tensor q4_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<4>(x, codes, params); }

// x [M, K] float32, codes [N/4, K/32, 2, 4, 16] uint8 (q + 128), params [N/4, 2, K/32, 4] float16 -> y [M, N] float32
Tensor q8_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<8>(x, codes, params); }

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
  m.def("q4_q8_isa() -> str", q4_q8_isa);
}

TORCH_LIBRARY_IMPL(kspec, CPU, m) {
  m.impl("q4_q8_matmul", q4_q8_matmul);
  m.impl("q8_q8_matmul", q8_q8_matmul);
}
