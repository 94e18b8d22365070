// What every instruction set's attention loops share (branch_layers.cpp runs them): the inputs of
// a layer's attention, the prefix cut into pieces for the threads, float16 prefix rows converted
// to float32 a chunk at a time, and the scalar steps of a softmax over a query's own entries.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../exp.h"
#include "../simd.h"

namespace {

// A float16 of the prompt's KV (the prefix, stored in 16 bits: a step reads half the bytes; the
// branches' own few entries stay float32). A struct, not its bits' integer type: the layer loop's bfloat16 is that.
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(f16) == 2);
const f16* f16_data(const at::Tensor& t) { return reinterpret_cast<const f16*>(t.data_ptr<c10::Half>()); }

// One row of D float16 bits as float32: per instruction set (avx512.h, avx2.h's F16C, generic.h)
template <int64_t D>
inline void half_row_to_float(const uint16_t* row, float* dst);

// The attention multiplies float32: prefix rows of float16 are converted a chunk at a time into
// a scratch of this many bytes (L1), float32 rows read in place
constexpr int64_t kConvertBytes = 16384;
template <int64_t D>
constexpr int64_t kConvertRows = kConvertBytes / (D * 4);

// Rows of the prefix a pass takes at a time: a float16 prefix a scratch's worth (converted), a
// float32 one all of them
template <typename KV, int64_t D>
inline int64_t chunk_rows(int64_t n) { return std::is_same_v<KV, float> ? std::max<int64_t>(n, 1) : kConvertRows<D>; }

// n rows of D elements at `stride` as float32 rows: a float32 source in place (stride kept);
// float16 ones converted into scratch [n, D] (stride D), each row's source asked for a few rows
// ahead (the prefix is not cached at a layer's turn)
template <int64_t D>
inline const float* rows_as_float(const float* src, int64_t, int64_t stride, float*, int64_t& out_stride) {
  out_stride = stride;
  return src;
}

template <int64_t D>
inline const float* rows_as_float(const f16* src, int64_t n, int64_t stride, float* scratch, int64_t& out_stride) {
  constexpr int64_t kAhead = 16;
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = &src[j * stride].bits;
    float* dst = scratch + j * D;
    for (int64_t line = 0; line < D * 2; line += 64)  // past the chunk too: the next chunk's rows (a prefetch never faults)
      __builtin_prefetch(reinterpret_cast<const char*>(row + kAhead * stride) + line);
    half_row_to_float<D>(row, dst);
  }
  out_stride = D;
  return scratch;
}

// Row r's place among a step's k T padded rows (branch p / T, new token p % T): padded_rows[r]
// where a step computes only some of them (check_rows), else r itself
inline int64_t padded_row(const int64_t* padded_rows, int64_t r) { return padded_rows ? padded_rows[r] : r; }

// Where a layer's attention reads its inputs: queries [R, H, D] float32 (row r: the padded row
// p = padded(r) of branch p / T, new token p % T), pre-softmax scale 1 / sqrt(D); the prefix
// [Hkv, P, D] of KV (float32 or f16; key stride p_key, head stride p_head, unit last stride,
// values alike); each branch's entries [k, Hkv, S, D] float32 contiguous, `cols` of them visible
// under the additive mask [k, 1, T, cols] (or all of them)
template <typename KV>
struct AttentionInputs {
  int64_t rows, heads, kv_heads, n_new, prefix, capacity, cols, p_head, p_key;
  const float* queries;
  const KV *prefix_k, *prefix_v;
  const float *branch_k, *branch_v, *mask;
  const int64_t* padded_rows;  // [R] each row's place among the k T padded rows; nullptr: row r is r

  int64_t group() const { return heads / kv_heads; }
  int64_t padded(int64_t r) const { return padded_row(padded_rows, r); }
  const float* own_keys(int64_t r, int64_t hk, int64_t D) const { return branch_k + ((padded(r) / n_new) * kv_heads + hk) * capacity * D; }
  const float* own_values(int64_t r, int64_t hk, int64_t D) const { return branch_v + ((padded(r) / n_new) * kv_heads + hk) * capacity * D; }
  const float* mask_row(int64_t r) const { return mask ? mask + padded(r) * cols : nullptr; }  // [k, 1, T, cols]: row b T + t
};

constexpr int64_t kMaxGroup = 16;  // query heads per kv head the written-out attention takes

// The prefix keys cut into `count` pieces so that the attention's work items (kv heads x query
// tiles x pieces) split evenly between the threads: at one or four rows of the default model
// there are 3 kv heads' items for 2 threads (one thread did two, the other one; measured on Zen 4)
struct PrefixPieces {
  int64_t count, keys;
  static constexpr int64_t kMaxPieces = 4;
  static constexpr int64_t kMinKeys = 64;  // per piece: below, the join costs more than the balance saves

  static PrefixPieces balancing(int64_t items, int64_t keys, int64_t threads) {
    for (int64_t count = 1; count <= kMaxPieces && keys >= count * kMinKeys; ++count)
      if ((items * count) % threads == 0) return {count, keys};
    return {1, keys};
  }
  int64_t start(int64_t piece) const { return piece * keys / count; }
  int64_t longest() const { return (keys + count - 1) / count; }
  bool last(int64_t piece) const { return piece == count - 1; }
};

// A query's scores over `cols` own entries plus the mask, into scores; returns their maximum
template <int64_t D>
float own_scores(const float* q, const float* keys, const float* mask, int64_t cols, float* scores, float top) {
  for (int64_t j = 0; j < cols; ++j) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += q[d] * keys[j * D + d];
    scores[j] = mask ? dot + mask[j] : dot;
    top = std::max(top, scores[j]);
  }
  return top;
}

// scores[j] = e^(scores[j] - top) for n scores; returns their sum
inline float exponentiate(float* scores, int64_t n, float top) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float e = exp_nonpositive(scores[j] - top);
    scores[j] = e;
    sum += e;
  }
  return sum;
}

// out[d] += sum_j p[j] values[j][d] over n values of row stride `stride`
template <int64_t D>
void weigh_values(const float* p, const float* values, int64_t stride, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] += p[j] * values[j * stride + d];
  }
}

}  // namespace
