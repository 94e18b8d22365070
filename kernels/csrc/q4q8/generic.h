// The generic loops: the activations' quantization in plain C++ (what a build without AVX2 runs;
// AVX2's and AVX-512 VNNI's make the same codes, avx2.h, avx512_vnni.h), and every form's dot one
// sum at a time, what a build without a vector loop for a form runs (correct, slow).
#pragma once

#include "layout.h"

namespace {

// One block of 32 activations: a = round(x / d) (to nearest even, as std::nearbyint), d = max|x| / 127;
// the sum of the block's x, d times the sum of its a and the sums of its a's halves
inline void quantize_block_scalar(const float* xb, int8_t* ab, float& d, float& total, float& code_sum, int32_t* halves) {
  float amax = 0.f;
  total = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : total)
  for (int64_t j = 0; j < kBlock; ++j) {
    amax = std::max(amax, std::fabs(xb[j]));
    total += xb[j];
  }
  d = amax / 127.f;
  const float inv = d > 0.f ? 1.f / d : 0.f;
  int32_t low = 0, high = 0;
#pragma omp simd reduction(+ : low)
  for (int64_t j = 0; j < kBlock / 2; ++j) {
    ab[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
    low += ab[j];
  }
#pragma omp simd reduction(+ : high)
  for (int64_t j = kBlock / 2; j < kBlock; ++j) {
    ab[j] = static_cast<int8_t>(std::nearbyint(xb[j] * inv));
    high += ab[j];
  }
  halves[0] = low;
  halves[1] = high;
  code_sum = d * static_cast<float>(low + high);
}

// Tile t, every row, one sum at a time: any form where no vector loop is built
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
        const float s = static_cast<float>(tp[n]), m = static_cast<float>(tp[kTile + n]), d = q.scale[r * blocks + b];
        if constexpr (Bits == 5 || Bits == 6) {  // codes: the nibble, then the fifth (and sixth) bit planes
          int32_t dot[2] = {0, 0};  // weights 0 .. 15, 16 .. 31
          for (int64_t j = 0; j < 4; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              const uint8_t code = tc[(j * kTile + n) * 4 + i];
              const int bit = static_cast<int>(4 * n + i);
              int32_t low = code & 0x0F, high = code >> 4;
              for (int plane = 4; plane < Bits; ++plane) {
                low += (1 << plane) * ((high_bits(tc, plane)[bit] >> j) & 1);
                high += (1 << plane) * ((high_bits(tc, plane)[bit] >> (j + 4)) & 1);
              }
              dot[0] += low * a[4 * j + i];
              dot[1] += high * a[16 + 4 * j + i];
            }
          if constexpr (Bits == 6) {  // w = s (u - 32) per half: s of weights 0 .. 15, then m's slot holds 16 .. 31's
            const int32_t* halves = q.half_sums.get() + 2 * (r * blocks + b);
            total += d * (s * static_cast<float>(dot[0] - kSixBitZero * halves[0]) + m * static_cast<float>(dot[1] - kSixBitZero * halves[1]));
          } else {
            total += s * d * static_cast<float>(dot[0] + dot[1]) + m * minimum_sums<Bits>(q)[r * blocks + b];
          }
        } else {
          int32_t dot = 0;
          for (int64_t j = 0; j < kTileRegisters<Bits>; ++j)
            for (int64_t i = 0; i < 4; ++i) {
              const uint8_t code = tc[(j * kTile + n) * 4 + i];
              if constexpr (Bits == 4)
                dot += (code & 0x0F) * a[4 * j + i] + (code >> 4) * a[16 + 4 * j + i];
              else
                dot += code * a[4 * j + i];
            }
          total += s * d * static_cast<float>(dot) + m * minimum_sums<Bits>(q)[r * blocks + b];
        }
      }
      y[r * ldy + t * kTile + n] = total;
    }
}

}  // namespace
