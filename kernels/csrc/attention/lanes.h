// The attention's tiles of queries in the lanes of vector registers (`attend_lanes`), written
// once over `Lanes`: 16 float32 lanes a register on AVX-512 (avx512.h), 8 on AVX2 (avx2.h).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "avx2.h"
#include "avx512.h"
#include "common.h"

#if KSPEC_LANES_ATTENTION
namespace {

constexpr int64_t kLanes = Lanes::kCount;  // float32 lanes of a register
constexpr int64_t kRegisters = kLanes == 16 ? 32 : 16;  // vector registers of the build

// The first pass over the keys (or values) reads part of each row: a row's whole D floats are
// asked for this many rows ahead, so that the later passes find them cached and the first one
// does not wait on memory a few lines at a time (the KV cache is never cached at a layer's
// turn: the weights streamed through since the layer's last step)
constexpr int64_t kPrefetchRows = 8;

template <int64_t D>
inline void prefetch_row(const float* row) {
  for (int64_t line = 0; line < D * 4; line += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + line, _MM_HINT_T0);
}

// A query tile: Regs registers of lanes, one query per lane (AVX2 takes 2 registers from more
// than one register's queries: each key element broadcast serves 16 queries). KeyBlock keys are
// scored together, KeyBlock x Regs accumulators held in registers.
template <int64_t Regs>
struct QueryTile {
  static constexpr int64_t kWidth = Regs * kLanes;  // queries
  static constexpr int64_t kKeyBlock = std::min<int64_t>(8, (kRegisters - 2 - Regs) / Regs);
};
constexpr int64_t kWideTileRegs = kLanes == 8 ? 2 : 1;

// Values are weighed kValueRegs registers of dimensions at a time, for kValueQueries queries:
// a loaded piece of a value row serves kValueQueries queries (Zen 3, 30 layers: 2 x 4 against
// 4 x 2 1.0-1.1x, against 1 x 8 equal but at 4 rows, whose 12 queries a tile 8 wide wastes)
constexpr int64_t kValueRegs = 2;
constexpr int64_t kValueQueries = 4;

// st [KB, W] = the tile's scaled queries qt [D, W] against KB key rows (stride p_key)
template <int64_t D, int64_t Regs, int64_t KB>
inline void score_keys(const float* qt, const float* keys, int64_t p_key, float* st) {
  constexpr int64_t W = QueryTile<Regs>::kWidth;
  Lanes::V acc[KB][Regs];
#pragma GCC unroll 16
  for (int64_t b = 0; b < KB; ++b)
#pragma GCC unroll 4
    for (int64_t r = 0; r < Regs; ++r) acc[b][r] = Lanes::zero();
  for (int64_t d = 0; d < D; ++d) {
    Lanes::V q[Regs];
#pragma GCC unroll 4
    for (int64_t r = 0; r < Regs; ++r) q[r] = Lanes::load(qt + d * W + r * kLanes);
#pragma GCC unroll 16
    for (int64_t b = 0; b < KB; ++b) {
      const Lanes::V key = Lanes::set1(keys[b * p_key + d]);
#pragma GCC unroll 4
      for (int64_t r = 0; r < Regs; ++r) acc[b][r] = Lanes::fmadd(key, q[r], acc[b][r]);
    }
  }
#pragma GCC unroll 16
  for (int64_t b = 0; b < KB; ++b)
#pragma GCC unroll 4
    for (int64_t r = 0; r < Regs; ++r) Lanes::storeu(st + b * W + r * kLanes, acc[b][r]);
}

// ot[m + i] [D] = sum_j p[j][m + i] values[j] for kValueQueries queries m + i of the tile,
// p [n, W] (the tile's weights per key), values n rows of stride p_key; `accumulate`: added to
// what ot holds (a chunk of the prefix after the first)
template <int64_t D, int64_t W>
inline void weigh_value_rows(const float* p, const float* values, int64_t p_key, int64_t n, int64_t m, bool prefetch, bool accumulate,
                             float* ot) {
  for (int64_t c = 0; c < D; c += kValueRegs * kLanes) {
    Lanes::V acc[kValueQueries][kValueRegs];
#pragma GCC unroll 8
    for (int64_t i = 0; i < kValueQueries; ++i)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kValueRegs; ++v) acc[i][v] = accumulate ? Lanes::loadu(ot + (m + i) * D + c + v * kLanes) : Lanes::zero();
    for (int64_t j = 0; j < n; ++j) {
      const float* value = values + j * p_key;
      if (prefetch && c == 0 && j + kPrefetchRows < n) prefetch_row<D>(value + kPrefetchRows * p_key);
      Lanes::V row[kValueRegs];
#pragma GCC unroll 4
      for (int64_t v = 0; v < kValueRegs; ++v) row[v] = Lanes::loadu(value + c + v * kLanes);
#pragma GCC unroll 8
      for (int64_t i = 0; i < kValueQueries; ++i) {
        const Lanes::V weight = Lanes::set1(p[j * W + m + i]);
#pragma GCC unroll 4
        for (int64_t v = 0; v < kValueRegs; ++v) acc[i][v] = Lanes::fmadd(weight, row[v], acc[i][v]);
      }
    }
#pragma GCC unroll 8
    for (int64_t i = 0; i < kValueQueries; ++i)
#pragma GCC unroll 4
      for (int64_t v = 0; v < kValueRegs; ++v) Lanes::storeu(ot + (m + i) * D + c + v * kLanes, acc[i][v]);
  }
}

// A kv head's queries (rows x its group of query heads) in the lanes of Regs registers, a tile
// of QueryTile<Regs>::kWidth at a time, against the shared prefix: a block of keys at a time,
// each key element broadcast against the tile's queries in one fused multiply-add per register
// (no transposition of the keys, no horizontal sums); the values weighed a few queries at a
// time, each loaded piece of a value row against their weights. Each query's own branch entries
// (few) one dot at a time. Items and emit as attend_direct.
template <int64_t D, int64_t Regs, typename KV, typename Emit>
void attend_lanes(const AttentionInputs<KV>& in, const PrefixPieces& pieces, Emit emit) {
  constexpr int64_t W = QueryTile<Regs>::kWidth, KB = QueryTile<Regs>::kKeyBlock;
  static_assert(D % (kValueRegs * kLanes) == 0 && W % kValueQueries == 0);
  const int64_t G = in.group(), M = in.rows * G, tiles = (M + W - 1) / W;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, in.kv_heads * tiles * pieces.count, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> prefix_scores(std::max<int64_t>(pieces.longest(), 1) * W);  // [piece, W]
    std::vector<float> branch_scores(W * std::max<int64_t>(in.cols, 1));  // [W, cols]
    std::vector<float> converted(std::is_same_v<KV, float> ? 0 : kConvertRows<D> * D);  // [chunk, D] float16 rows as float32
    alignas(64) float qt[D * W];  // [D, W] the tile's queries, scaled
    alignas(64) float ot[W * D];  // [W, D] their prefix values' weighted sums
    alignas(64) float top[W];
    alignas(64) float total[W];
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t piece = item % pieces.count, base = item / pieces.count;
      const int64_t hk = base / tiles, m0 = (base % tiles) * W, lanes = std::min(W, M - m0);
      const int64_t p0 = pieces.start(piece), P = pieces.start(piece + 1) - p0;
      const int64_t cols = pieces.last(piece) ? in.cols : 0;
      std::fill(qt, qt + D * W, 0.f);
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t r = (m0 + l) / G, h = hk * G + (m0 + l) % G;
        for (int64_t d = 0; d < D; ++d) qt[d * W + l] = in.queries[(r * in.heads + h) * D + d] * scale;
      }
      float* st = prefix_scores.data();
      const KV* keys = in.prefix_k + hk * in.p_head + p0 * in.p_key;
      const int64_t chunk = chunk_rows<KV, D>(P);
      for (int64_t j0 = 0; j0 < P; j0 += chunk) {
        const int64_t n = std::min(chunk, P - j0);
        int64_t stride;
        const float* rows = rows_as_float<D>(keys + j0 * in.p_key, n, in.p_key, converted.data(), stride);
        int64_t j = 0;
        for (; j + KB <= n; j += KB) {
          if constexpr (std::is_same_v<KV, float>)  // converted rows were asked for by the conversion
            for (int64_t b = 0; b < KB && j + kPrefetchRows + b < n; ++b) prefetch_row<D>(rows + (j + kPrefetchRows + b) * stride);
          score_keys<D, Regs, KB>(qt, rows + j * stride, stride, st + (j0 + j) * W);
        }
        for (; j < n; ++j) score_keys<D, Regs, 1>(qt, rows + j * stride, stride, st + (j0 + j) * W);
      }
      std::fill(top, top + W, -INFINITY);
      for (int64_t k = 0; k < P; ++k) {
#pragma omp simd
        for (int64_t l = 0; l < W; ++l) top[l] = std::max(top[l], st[k * W + l]);
      }
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t r = (m0 + l) / G;
        float q[D];
        for (int64_t d = 0; d < D; ++d) q[d] = qt[d * W + l];
        top[l] = own_scores<D>(q, in.own_keys(r, hk, D), in.mask_row(r), cols, branch_scores.data() + l * in.cols, top[l]);
      }
      std::fill(total, total + W, 0.f);
      for (int64_t k = 0; k < P; ++k) {
        float* row = st + k * W;
#pragma omp simd
        for (int64_t l = 0; l < W; ++l) {
          const float e = exp_nonpositive(row[l] - top[l]);
          row[l] = e;
          total[l] += e;
        }
      }
      const KV* values = in.prefix_v + hk * in.p_head + p0 * in.p_key;
      for (int64_t j0 = 0; j0 < std::max<int64_t>(P, 1); j0 += chunk) {  // an empty piece still zeroes ot
        const int64_t n = std::min(chunk, P - j0);
        int64_t stride;
        const float* rows = rows_as_float<D>(values + j0 * in.p_key, n, in.p_key, converted.data(), stride);
        for (int64_t m = 0; m < lanes; m += kValueQueries)
          weigh_value_rows<D, W>(st + j0 * W, rows, stride, n, m, std::is_same_v<KV, float> && m == 0, j0 > 0, ot);
      }
      for (int64_t l = 0; l < lanes; ++l) {
        const int64_t r = (m0 + l) / G, h = hk * G + (m0 + l) % G;
        float* sb = branch_scores.data() + l * in.cols;
        float* o = ot + l * D;
        const float sum = total[l] + exponentiate(sb, cols, top[l]);
        weigh_values<D>(sb, in.own_values(r, hk, D), D, cols, o);
        emit(r, h, piece, o, top[l], sum);
      }
    }
  });
}

// Tiles of a kv head's queries and their registers: one register where the queries fit in one
template <int64_t Regs, typename KV>
inline int64_t query_tiles(const AttentionInputs<KV>& in) { return (in.rows * in.group() + QueryTile<Regs>::kWidth - 1) / QueryTile<Regs>::kWidth; }
template <typename KV>
inline bool wide_tiles(const AttentionInputs<KV>& in) { return in.rows * in.group() > kLanes; }

// Query vectors per kv head from which a kv head's queries share registers (attend_lanes)
// rather than go one at a time (attend_direct): three quarters of a register's lanes. The
// default model's kv heads have 3 queries per row. Measured on Zen 4 (16 lanes): 3 one at a
// time, 12 in lanes. On Zen 3 (8 lanes; 30 layers, 512 prefix keys, interleaved): 6 (two rows)
// in lanes 1.18-1.22x faster than one at a time, which reads the keys and values once per row;
// 3 in lanes 0.70x.
constexpr int64_t kLanesFromQueries = (3 * kLanes + 3) / 4;

}  // namespace
#endif
