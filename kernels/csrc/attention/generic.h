// Plain C++ of the attention, on every build: one query row at a time against the prefix and its
// own entries (`attend_direct`, loops the compiler vectorizes; AVX2 builds score heads of 64 in
// avx2.h's row blocks), and float16 rows converted one value at a time where the build has
// neither AVX-512 nor F16C.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "avx2.h"
#include "common.h"

namespace {

#if !KSPEC_ATTENTION_AVX512 && !defined(__F16C__)
template <int64_t D>
inline void half_row_to_float(const uint16_t* row, float* dst) {
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(c10::Half(row[d], c10::Half::from_bits()));
}
#endif

// scores[j] = q . keys[j] for n key rows of D (stride)
template <int64_t D>
inline void score_rows(const float* q, const float* keys, int64_t stride, int64_t n, float* scores) {
#if KSPEC_ROW_BLOCKS
  if constexpr (D == 64) return score_rows64(q, keys, stride, n, scores);
#endif
  for (int64_t j = 0; j < n; ++j) {
    const float* key = keys + j * stride;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += q[d] * key[d];
    scores[j] = dot;
  }
}

// out [D] += sum_j p[j] values[j] over n value rows of D (stride)
template <int64_t D>
inline void weigh_rows(const float* p, const float* values, int64_t stride, int64_t n, float* out) {
#if KSPEC_ROW_BLOCKS
  if constexpr (D == 64) return weigh_rows64(p, values, stride, n, out);
#endif
  weigh_values<D>(p, values, stride, n, out);
}

// One row at a time: its group of query heads against the prefix keys, a chunk of keys at a
// time (each chunk read once for the group), then its own entries; for a step of few rows, where the
// flash kernel's fixed cost dominates. Items are (row, kv head, piece of the prefix); the last
// piece also takes the row's own entries. emit(r, h, piece, o, top, sum) takes the piece's
// output o [D] unnormalized (weights e^(score - top)) and its sum of weights.
template <int64_t D, typename KV, typename Emit>
void attend_direct(const AttentionInputs<KV>& in, const PrefixPieces& pieces, Emit emit) {
  const int64_t G = in.group(), n = pieces.longest() + in.cols;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, in.rows * in.kv_heads * pieces.count, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(G * n);  // [G, piece + cols]
    std::vector<float> converted(std::is_same_v<KV, float> ? 0 : kConvertRows<D> * D);  // [chunk, D] float16 rows as float32
    alignas(64) float q[kMaxGroup * D];
    alignas(64) float o[kMaxGroup * D];
    float top[kMaxGroup], sum[kMaxGroup];
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t piece = item % pieces.count, base = item / pieces.count;
      const int64_t r = base / in.kv_heads, hk = base % in.kv_heads, h0 = hk * G;
      const int64_t p0 = pieces.start(piece), P = pieces.start(piece + 1) - p0;
      const int64_t cols = pieces.last(piece) ? in.cols : 0;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d) q[g * D + d] = in.queries[(r * in.heads + h0 + g) * D + d] * scale;
      const KV* keys = in.prefix_k + hk * in.p_head + p0 * in.p_key;
      const KV* values = in.prefix_v + hk * in.p_head + p0 * in.p_key;
      const int64_t p_key = in.p_key, chunk = kConvertRows<D>;  // float32 rows too: a chunk stays in L1 for the group
      for (int64_t j0 = 0; j0 < P; j0 += chunk) {
        const int64_t m = std::min(chunk, P - j0);
        int64_t stride;
        const float* rows = rows_as_float<D>(keys + j0 * p_key, m, p_key, converted.data(), stride);
        for (int64_t g = 0; g < G; ++g) score_rows<D>(q + g * D, rows, stride, m, scores.data() + g * n + j0);
      }
      for (int64_t g = 0; g < G; ++g) {
        float* row = scores.data() + g * n;
        float best = -INFINITY;
#pragma omp simd reduction(max : best)
        for (int64_t j = 0; j < P; ++j) best = std::max(best, row[j]);
        top[g] = own_scores<D>(q + g * D, in.own_keys(r, hk, D), in.mask_row(r), cols, row + P, best);
        sum[g] = exponentiate(row, P + cols, top[g]);
      }
      std::fill(o, o + G * D, 0.f);
      for (int64_t j0 = 0; j0 < P; j0 += chunk) {  // each chunk of value rows read (converted) once for the group
        const int64_t m = std::min(chunk, P - j0);
        int64_t stride;
        const float* rows = rows_as_float<D>(values + j0 * p_key, m, p_key, converted.data(), stride);
        for (int64_t g = 0; g < G; ++g) weigh_rows<D>(scores.data() + g * n + j0, rows, stride, m, o + g * D);
      }
      for (int64_t g = 0; g < G; ++g) {
        weigh_values<D>(scores.data() + g * n + P, in.own_values(r, hk, D), D, cols, o + g * D);
        emit(r, h0 + g, piece, o + g * D, top[g], sum[g]);
      }
    }
  });
}

}  // namespace
