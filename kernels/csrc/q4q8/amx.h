// AMX loops of the 4-, 5-, 6- and 8-bit forms, for many rows (a verification of k x (gamma + 1)
// rows, a prefill chunk): one tdpbsud multiplies up to 16 rows' 8-bit activations of a block by a
// tile's 16 outputs' codes, where the VNNI loop (avx512_vnni.h) spends 8 vpdpbusd a row.
//
// The forms' layout already is AMX's: a block's unpacked register j holds weights 4j .. 4j + 3 of
// each of the tile's 16 outputs, one output a 32-bit lane, which is a B tile's row j (K/4 rows of
// 16 x 4 bytes). Per tile, block and 16 rows: the codes unpack as the VNNI loop unpacks them into
// an L1 buffer (the 8-bit form's codes are loaded as they lie), the rows' activations load as an A
// tile straight from `Quantized::a` (stride K), tdpbsud gives the exact int32 sums (signed
// activations x unsigned codes), and the float scaling is the VNNI loop's, in the same order: the
// results are the VNNI loop's, bit for bit (tests/kernels/test_q4_q8_matmul.py). The 6-bit form
// multiplies its two half blocks apart (two tiles of sums; its halves have scales of their own).
//
// A process may use AMX's tile data only once it has asked Linux for it (arch_prctl
// ARCH_REQ_XCOMP_PERM); where that fails (an older kernel, a VM that hides it) the VNNI loop serves.
#pragma once

#include "avx512_vnni.h"

#if KSPEC_Q4Q8_AMX
#include <sys/syscall.h>
#include <unistd.h>

namespace {

// Rows of a tile (AMX's maximum), also the fewest a matmul runs on AMX: measured on an Intel Xeon
// (Sapphire Rapids class, 2 cores), against the VNNI loop, the 0.5B and 1.5B models' shapes: 1.1-1.4x
// at 16 to 256 rows for the 4- and 5-bit forms, 1.0-1.1x for the 6-bit one, 1.3-1.6x for the 8-bit
// one; slower at 8 to 12 rows (a tile mostly empty), so a last group under 16 rows takes the VNNI loop
// (docs/measurements/amx-tiles.md)
constexpr int kAmxRows = 16;
constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
constexpr long kXfeatureXtiledata = 18;     // AMX's tile data

// Linux lets this process use AMX's tiles (asked once, at the first call)
inline bool amx_ready() {
  static const bool ready = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ready;
}

// Tile registers, two sets that alternate between blocks so that one block's products overlap the
// previous one's scaling: sums 0 and 1 (the 6-bit form's second half in 1) for even blocks, 2 and 3
// for odd ones; activations 4 (even blocks, or the first half) and 5; codes 6 and 7 likewise
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Activations per row of an A tile: a block's 32, or the 6-bit form's halves of 16
template <int Bits>
constexpr int kAmxDepth = Bits == 6 ? kBlock / 2 : kBlock;

// The tiles for kAmxRows rows of a form
template <int Bits>
void configure_tiles() {
  TileConfig config;
  for (int tile = 0; tile < 4; ++tile) {  // int32 sums of 16 outputs
    config.rows[tile] = kAmxRows;
    config.bytes_per_row[tile] = kTile * 4;
  }
  for (int tile = 4; tile < 6; ++tile) {
    config.rows[tile] = kAmxRows;
    config.bytes_per_row[tile] = kAmxDepth<Bits>;
  }
  for (int tile = 6; tile < 8; ++tile) {
    config.rows[tile] = kAmxDepth<Bits> / 4;
    config.bytes_per_row[tile] = kTile * 4;
  }
  asm volatile("" : : "r"(&config) : "memory");  // GCC 12 drops the fields' stores before ldtilecfg otherwise
  _tile_loadconfig(&config);
}

// A block's codes as bytes [8, 16, 4] in `out` (the B tile's rows)
template <int Bits>
inline void unpack_block(const uint8_t* tc, uint8_t* out) {
  __m512i w[8];
  unpack_codes<Bits>(tc, w);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) _mm512_store_si512(out + 64 * j, w[j]);
}

// One block's integer sums into sums [halves, kAmxRows, 16], on the tile set of the block's parity (GCC's tile
// intrinsics take their registers' numbers as literals)
template <int Bits, int Parity>
inline void multiply_block(const int8_t* a, int64_t k, const uint8_t* b_rows, int32_t* sums, int64_t half_stride) {
  if constexpr (Bits == 6) {  // halves: activations 4 and 5, codes 6 and 7, sums 0 and 1 or 2 and 3
    _tile_loadd(4, a, k);
    _tile_loadd(6, b_rows, 64);
    _tile_loadd(5, a + kBlock / 2, k);
    _tile_loadd(7, b_rows + 4 * 64, 64);
    if constexpr (Parity == 0) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_dpbsud(0, 4, 6);
      _tile_dpbsud(1, 5, 7);
      _tile_stored(0, sums, kTile * 4);
      _tile_stored(1, sums + half_stride, kTile * 4);
    } else {
      _tile_zero(2);
      _tile_zero(3);
      _tile_dpbsud(2, 4, 6);
      _tile_dpbsud(3, 5, 7);
      _tile_stored(2, sums, kTile * 4);
      _tile_stored(3, sums + half_stride, kTile * 4);
    }
  } else if constexpr (Parity == 0) {
    _tile_zero(0);
    _tile_loadd(4, a, k);
    _tile_loadd(6, b_rows, 64);
    _tile_dpbsud(0, 4, 6);
    _tile_stored(0, sums, kTile * 4);
  } else {
    _tile_zero(2);
    _tile_loadd(5, a, k);
    _tile_loadd(7, b_rows, 64);
    _tile_dpbsud(2, 5, 7);
    _tile_stored(2, sums, kTile * 4);
  }
}

// acc[r] += block b's scaled sums, in the VNNI loop's order (the 6-bit form's halves less 32 sum a)
template <int Bits, typename P>
inline void scale_block(const Quantized& q, int64_t r0, int64_t blocks, int64_t t, int64_t b, P params, const int32_t* sums,
                        __m512* acc) {
  const float* xd = q.scale.get() + r0 * blocks;                // [kAmxRows, blocks]
  const float* xs = minimum_sums<Bits>(q).get() + r0 * blocks;  // [kAmxRows, blocks]
  __m512 scales, mins;
  block_params<Bits>(params, blocks, t, b, scales, mins);
#pragma GCC unroll 16
  for (int r = 0; r < kAmxRows; ++r) {
    const __m512 d = _mm512_set1_ps(xd[r * blocks + b]);
    if constexpr (Bits == 6) {
      const int32_t* halves = q.half_sums.get() + 2 * ((r0 + r) * blocks + b);
      const __m512i dot0 = _mm512_add_epi32(_mm512_load_si512(sums + r * kTile), _mm512_set1_epi32(-kSixBitZero * halves[0]));
      const __m512i dot1 = _mm512_add_epi32(_mm512_load_si512(sums + (kAmxRows + r) * kTile), _mm512_set1_epi32(-kSixBitZero * halves[1]));
      acc[r] = add_scaled_halves(acc[r], scales, mins, d, dot0, dot1);
    } else {
      const __m512 sum_x = _mm512_set1_ps(xs[r * blocks + b]);
      acc[r] = add_scaled_block(acc[r], scales, mins, d, sum_x, _mm512_load_si512(sums + r * kTile));
    }
  }
}

// One tile's 16 outputs x kAmxRows rows from r0, over every block; the tiles configured.
// Pipelined: block b's codes are unpacked a block ahead (their stores done before the tile loads
// them) and its sums scaled a block behind (the tiles' stores done before the vector loads)
template <int Bits, typename P>
void dot_tile_amx(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, float* y, int64_t ldy) {
  static_assert(Bits == 4 || Bits == 5 || Bits == 6 || Bits == 8);
  constexpr int64_t kSums = (Bits == 6 ? 2 : 1) * kAmxRows * kTile;
  const int64_t blocks = k / kBlock;
  const int8_t* a0 = q.a.get() + r0 * k;
  const uint8_t* tile_codes = codes + t * blocks * kTileBytes<Bits>;  // [blocks, registers, 16, 4]
  alignas(64) uint8_t unpacked[2][8 * 64];  // [parity, 8, 16, 4]
  alignas(64) int32_t sums[2][kSums];       // [parity, halves, kAmxRows, 16]
  __m512 acc[kAmxRows];
#pragma GCC unroll 16
  for (int r = 0; r < kAmxRows; ++r) acc[r] = _mm512_setzero_ps();
  if constexpr (Bits != 8) unpack_block<Bits>(tile_codes, unpacked[0]);
  for (int64_t b = 0; b < blocks; ++b) {
    const int parity = static_cast<int>(b & 1);
    const uint8_t* tc = tile_codes + b * kTileBytes<Bits>;
    prefetch_block<Bits>(tc, params, blocks, t, b, kPrefetchBlocks);
    const uint8_t* b_rows = Bits == 8 ? tc : unpacked[parity];
    if (parity == 0)
      multiply_block<Bits, 0>(a0 + b * kBlock, k, b_rows, sums[0], kAmxRows * kTile);
    else
      multiply_block<Bits, 1>(a0 + b * kBlock, k, b_rows, sums[1], kAmxRows * kTile);
    if constexpr (Bits != 8)
      if (b + 1 < blocks) unpack_block<Bits>(tc + kTileBytes<Bits>, unpacked[parity ^ 1]);
    if (b > 0) scale_block<Bits>(q, r0, blocks, t, b - 1, params, sums[parity ^ 1], acc);
  }
  scale_block<Bits>(q, r0, blocks, t, blocks - 1, params, sums[(blocks - 1) & 1], acc);
#pragma GCC unroll 16
  for (int r = 0; r < kAmxRows; ++r) _mm512_storeu_ps(y + (r0 + r) * ldy + t * kTile, acc[r]);
}

// Every row of tiles t0 .. t1 - 1, a tile at a time: its groups of 16 rows on AMX, then the fewer than
// 16 left over on the VNNI loop while the tile's codes are still in cache (row groups outside the tile
// loop read the weights from memory once per group: 17 rows cost 1.3x 16 rows, docs/measurements/amx-draft-budget.md)
template <int Bits, typename P>
void dot_range_amx(const Quantized& q, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t0, int64_t t1,
                   float* y, int64_t ldy) {
  const int64_t tile_rows = rows / kAmxRows * kAmxRows;
  configure_tiles<Bits>();
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r = 0; r < tile_rows; r += kAmxRows) dot_tile_amx<Bits>(q, r, codes, params, k, t, y, ldy);
    if (tile_rows < rows) dot_range_vnni<Bits>(q, tile_rows, rows, codes, params, k, t, t + 1, y, ldy);
  }
  _tile_release();
}

}  // namespace
#endif
