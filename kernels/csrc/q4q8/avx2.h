// AVX2 loops of the 4-, 5-, 6- and 8-bit forms (maddubs: 32 unsigned x signed byte products a
// register); an AVX-512 VNNI build uses avx512_vnni.h instead.
#pragma once

#include <type_traits>

#include "layout.h"

#if KSPEC_Q4Q8_AVX2 && !KSPEC_Q4Q8_VNNI
namespace {

// One block of 32 activations as generic.h's quantize_block_scalar makes it (a = round(x / d) to
// nearest even, d = max|x| / 127; the same a, d and sums of a; the sum of x in another order), four
// registers at a time instead of the compiler's scalar loop for the rounding (2 % of a 4-row step)
inline void quantize_block_avx2(const float* xb, int8_t* ab, float& d, float& total, float& code_sum, int32_t* halves) {
  __m256 x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) x[i] = _mm256_loadu_ps(xb + 8 * i);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(x[0], magnitude), _mm256_and_ps(x[1], magnitude)),
                                    _mm256_max_ps(_mm256_and_ps(x[2], magnitude), _mm256_and_ps(x[3], magnitude)));
  total = sum_lanes(_mm256_add_ps(_mm256_add_ps(x[0], x[1]), _mm256_add_ps(x[2], x[3])));
  d = max_lanes(amax) / 127.f;
  const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
  __m256i a[4];  // int32, |a| <= 127
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) a[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], inv));  // to nearest even (MXCSR's default)
  // int32 -> int16 -> int8, each pack interleaving 128-bit lanes; the permute puts them back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(ab), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  halves[0] = sum_lanes(_mm256_add_epi32(a[0], a[1]));
  halves[1] = sum_lanes(_mm256_add_epi32(a[2], a[3]));
  code_sum = d * static_cast<float>(halves[0] + halves[1]);
}

// Tile t's block b's s and m of outputs 8 half .. 8 half + 7, from the pairs, ...
template <int Bits>
inline void half_params(PairParams p, int64_t blocks, int64_t t, int64_t b, int half, __m256& s, __m256& m) {
  const c10::Half* tp = params_of(p, blocks, t, b) + 8 * half;  // s at 0, m at 16
  s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp)));
  m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tp + kTile)));
}

// ... or a symmetric form's s alone (m = -2^(bits - 1) s: exact, as the pairs hold it)
template <int Bits>
inline void half_params(SymmetricParams p, int64_t blocks, int64_t t, int64_t b, int half, __m256& s, __m256& m) {
  s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(params_of(p, blocks, t, b) + 8 * half)));
  m = _mm256_mul_ps(s, _mm256_set1_ps(kSymmetricZero<Bits>));
}

// One block's share of 8 outputs for one row from its int32 dots: acc + s d dot + m sum_x (the 4- and
// 5-bit forms; every loop of them scales a block in this order, so that they give the same bits)
inline __m256 add_dot_avx2(__m256 acc, __m256i dot, __m256 scales, __m256 mins, float d, float sum_x) {
  return _mm256_fmadd_ps(_mm256_mul_ps(scales, _mm256_set1_ps(d)), _mm256_cvtepi32_ps(dot), _mm256_fmadd_ps(mins, _mm256_set1_ps(sum_x), acc));
}

// ... from the 4-bit form's int16 pair sums (maddubs)
inline __m256 add_block_avx2(__m256 acc, __m256i pairs, __m256 scales, __m256 mins, float d, float sum_x) {
  return add_dot_avx2(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)), scales, mins, d, sum_x);
}

// The 6-bit form's: acc + d (s0 dot0 + s1 dot1), each dot less 32 times its half's sum of a
inline __m256 add_halves_avx2(__m256 acc, __m256 s0, __m256 s1, float d, __m256i dot0, __m256i dot1) {
  const __m256 both = _mm256_fmadd_ps(s0, _mm256_cvtepi32_ps(dot0), _mm256_mul_ps(s1, _mm256_cvtepi32_ps(dot1)));
  return _mm256_fmadd_ps(_mm256_set1_ps(d), both, acc);
}

// The 8-bit form's: acc + s d (q . a), then + (m + 128 s) d sum a, which a symmetric form's m = -128 s
// makes 0 (left out: the same value)
template <bool Symmetric>
inline __m256 add_q8_dot_avx2(__m256 acc, __m256i dot, __m256 scales, __m256 shift, float d, float code_sum) {
  acc = _mm256_fmadd_ps(_mm256_mul_ps(scales, _mm256_set1_ps(d)), _mm256_cvtepi32_ps(dot), acc);
  return Symmetric ? acc : _mm256_fmadd_ps(shift, _mm256_set1_ps(code_sum), acc);
}

// AVX2, 4-bit codes: half a tile (8 outputs, the low or high 32 bytes of each of the block's
// four 64-byte registers) x R rows. maddubs of the unsigned codes and 4 broadcast signed
// activations gives two int16 pair sums per lane (2 * 15 * 127); the block's 8 of them add in
// int16 without saturating (8 * 3810 < 2^15), then one madd with ones makes each output's int32 dot.
template <int R, typename P>
void dot_half_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, int half, float* y,
                   int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* xs = q.sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_codes = codes + (t * blocks + b) * kTileBytes<4>;  // [4, 16, 4]
    if (half == 0) prefetch_block<4>(block_codes, params, blocks, t, b, kPrefetchBlocksAvx2);  // half 1 finds them cached
    const uint8_t* tc = block_codes + 32 * half;  // 4 x 32 bytes, 64 apart
    __m256i packed[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) packed[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tc + 64 * p));
    __m256 scales, mins;
    half_params<4>(params, blocks, t, b, half, scales, mins);
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
template <int R, typename P>
void dot_full_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* xs = q.sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* tc = codes + (t * blocks + b) * kTileBytes<4>;  // [4, 16, 4]
    prefetch_block<4>(tc, params, blocks, t, b, kPrefetchBlocksAvx2);
    __m256 scales[2], mins[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) half_params<4>(params, blocks, t, b, h, scales[h], mins[h]);
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

// AVX2, many rows, every form: a tile's codes for a run of blocks unpacked once into 8-bit codes
// (and its float16 params into float32) in a scratch that stays in L1, then every row reads them
// from there. Unpacking (3 instructions per 32 4-bit codes, 3 more a bit plane for 5 and 6 bits,
// the sign flips for 8) and the registers that held unpacked codes across rows were what bounded the
// half tiles at 4 and more rows; from the scratch a code register is a plain load, so R rows x both
// halves of the tile take their maddubs back to back.
constexpr int64_t kUnpackedChunk = 8;     // blocks unpacked at a time: 8 x 704 (4-6 bits) or 1152 (8-bit) bytes of scratch

// Rows from which a form takes the scratch; fewer keep the half tiles (Zen 3, 4-bit: equal at 3 and 4
// rows, 1.03x slower at 5; Zen 4, one form's op against its half tiles, medians over 8 alternated
// processes: 6-bit 1.08-1.11x at 1 to 4 rows, 5-bit 1.06-1.10x at 3 and 4 rows but 0.95-0.97x at one)
template <int Bits>
constexpr int64_t kUnpackedFromRows = Bits == 6 ? 1 : Bits == 5 ? 3 : 5;

// Rows at a time: the 4/5/6-bit forms' 12 int16 sums (the 8-bit form's int32 ones), 2 codes and a
// broadcast in 16 registers
constexpr int64_t kUnpackedRows = 6;

// Registers whose maddubs add in int16 without saturating before a madd makes int32 sums:
// 8 x 2 x 15 x 127, 4 x 2 x 31 x 127, 2 x 2 x 63 x 127 < 2^15 (the 8-bit form's |q| x |a|, 2 x 128 x 127, one)
template <int Bits>
constexpr int kInt16Registers = Bits == 4 ? 8 : Bits == 5 ? 4 : Bits == 6 ? 2 : 1;

template <int Bits>
struct UnpackedBlock {  // one block of a tile: 8-bit codes [8, 16, 4] (weights 4j .. 4j + 3 in register j) and its params
  alignas(64) uint8_t codes[8][kTile * 4];                  // the unsigned codes; the 8-bit form's |q|
  alignas(64) int8_t signs[Bits == 8 ? 8 : 1][kTile * 4];  // the 8-bit form's q, whose signs its activations take
  alignas(64) float scales[kTile];                          // s (6-bit: s of weights 0 .. 15)
  alignas(64) float mins[kTile];                            // m (6-bit: s of weights 16 .. 31; 8-bit: m + 128 s)
};

// Half `half` of a block's codes as 8 registers of unsigned codes (the 8-bit form's |q|, its q to `signs`)
template <int Bits>
inline void unpack_half_avx2(const uint8_t* block_codes, int half, __m256i* w, int8_t (*signs)[kTile * 4]) {
  if constexpr (Bits == 8) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_codes + 64 * j + 32 * half)), flip);
      _mm256_store_si256(reinterpret_cast<__m256i*>(signs[j] + 32 * half), q);
      w[j] = _mm256_sign_epi8(q, q);  // |q| <= 128 as an unsigned byte
    }
  } else {
    const __m256i low_mask = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_codes + 64 * p + 32 * half));
      w[p] = _mm256_and_si256(packed, low_mask);                           // weights 4p ..
      w[p + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_mask);  // weights 16 + 4p ..
    }
#pragma GCC unroll 2
    for (int plane = 4; plane < Bits; ++plane) {  // register j's bit from bit j of the plane's bytes
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high_bits(block_codes, plane) + 32 * half));
      const __m256i value = _mm256_set1_epi8(static_cast<char>(1 << plane));
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {  // 16-bit shifts by at most 5 leave bit `plane` of each byte within its byte
        const __m256i moved = plane >= j ? _mm256_slli_epi16(bits, plane - j) : _mm256_srli_epi16(bits, j - plane);
        w[j] = _mm256_or_si256(w[j], _mm256_and_si256(moved, value));
      }
    }
  }
}

// Blocks b0 .. b0 + n - 1 of tile t into scratch
template <int Bits, typename P>
inline void unpack_tile_avx2(const uint8_t* codes, P params, int64_t blocks, int64_t t, int64_t b0, int64_t n,
                             UnpackedBlock<Bits>* scratch) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* tc = codes + (t * blocks + b0 + i) * kTileBytes<Bits>;  // [registers, 16, 4]
    prefetch_block<Bits>(tc, params, blocks, t, b0 + i, kPrefetchBlocksAvx2);
    UnpackedBlock<Bits>& u = scratch[i];
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m256i w[8];
      unpack_half_avx2<Bits>(tc, half, w, u.signs);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[j] + 32 * half), w[j]);
      __m256 scales, mins;
      half_params<Bits>(params, blocks, t, b0 + i, half, scales, mins);
      _mm256_store_ps(u.scales + 8 * half, scales);
      _mm256_store_ps(u.mins + 8 * half, Bits == 8 ? _mm256_fmadd_ps(scales, _mm256_set1_ps(128.f), mins) : mins);
    }
  }
}

// The 4-, 5- and 6-bit forms: R rows from r0 of tile t over the n unpacked blocks from b0, added to
// y's 16 outputs of each row (zeroed before the first chunk). Only the R x 2 int16 sums live in
// registers through a run of kInt16Registers code registers, so that two loaded code registers serve
// all R rows; their int32 sums (the 6-bit form's one per half block, started at -32 its sum of a)
// and the float fold (as the half tiles': add_block_avx2, the 6-bit form's halves) go through L1.
template <int Bits, int R>
void dot_unpacked_avx2(const Quantized& q, int64_t r0, const UnpackedBlock<Bits>* scratch, int64_t b0, int64_t n, int64_t k,
                       int64_t t, float* y, int64_t ldy) {
  static_assert(Bits == 4 || Bits == 5 || Bits == 6);
  constexpr int kDots = Bits == 6 ? 2 : 1;
  constexpr int kRuns = 8 / kInt16Registers<Bits>;
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;                // [R, blocks]
  const float* xs = minimum_sums<Bits>(q).get() + r0 * blocks;  // [R, blocks]
  const int32_t* halves = q.half_sums.get() + 2 * r0 * blocks;  // [R, blocks, 2]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i ones = _mm256_set1_epi16(1);
  float* y0 = y + r0 * ldy + t * kTile;
  for (int64_t i = 0; i < n; ++i) {
    const UnpackedBlock<Bits>& u = scratch[i];
    const int64_t b = b0 + i;
    __m256i dots[R][2][kDots];  // int32
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int c = 0; c < kDots; ++c)
        dots[r][0][c] = dots[r][1][c] = Bits == 6 ? _mm256_set1_epi32(-kSixBitZero * halves[2 * (r * blocks + b) + c]) : _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int run = 0; run < kRuns; ++run) {
      __m256i pairs[R][2];  // int16
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) pairs[r][0] = pairs[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int jj = 0; jj < kInt16Registers<Bits>; ++jj) {
        const int j = run * kInt16Registers<Bits> + jj;
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
      const int c = Bits == 6 ? run * kInt16Registers<Bits> / 4 : 0;  // the 6-bit form's half block
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) dots[r][h][c] = _mm256_add_epi32(dots[r][h][c], _mm256_madd_epi16(pairs[r][h], ones));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        float* out = y0 + r * ldy + 8 * h;
        const __m256 first = _mm256_load_ps(u.scales + 8 * h), second = _mm256_load_ps(u.mins + 8 * h);
        _mm256_storeu_ps(out, Bits == 6 ? add_halves_avx2(_mm256_loadu_ps(out), first, second, xd[r * blocks + b], dots[r][h][0], dots[r][h][kDots - 1])
                                        : add_dot_avx2(_mm256_loadu_ps(out), dots[r][h][0], first, second, xd[r * blocks + b], xs[r * blocks + b]));
      }
  }
}

// The 8-bit form: as above, each activation register taking the sign of the codes (dot_half_q8_avx2's
// arithmetic) and each maddubs made int32 at once; the symmetric form's m + 128 s is 0
template <int R, bool Symmetric>
void dot_unpacked_q8_avx2(const Quantized& q, int64_t r0, const UnpackedBlock<8>* scratch, int64_t b0, int64_t n, int64_t k,
                          int64_t t, float* y, int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const float* cs = q.code_sum.get() + r0 * blocks;  // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i ones = _mm256_set1_epi16(1);
  float* y0 = y + r0 * ldy + t * kTile;
  for (int64_t i = 0; i < n; ++i) {
    const UnpackedBlock<8>& u = scratch[i];
    const int64_t b = b0 + i;
    __m256i dots[R][2];  // int32
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) dots[r][0] = dots[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.codes[j]));
      const __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.codes[j] + 32));
      const __m256i s0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.signs[j]));
      const __m256i s1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.signs[j] + 32));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_set1_epi32(four_bytes(a0 + r * k + b * kBlock + 4 * j));
        dots[r][0] = _mm256_add_epi32(dots[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(c0, _mm256_sign_epi8(x, s0)), ones));
        dots[r][1] = _mm256_add_epi32(dots[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(c1, _mm256_sign_epi8(x, s1)), ones));
        keep_in_registers(dots[r][0], dots[r][1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        float* out = y0 + r * ldy + 8 * h;
        _mm256_storeu_ps(out, add_q8_dot_avx2<Symmetric>(_mm256_loadu_ps(out), dots[r][h], _mm256_load_ps(u.scales + 8 * h),
                                                         _mm256_load_ps(u.mins + 8 * h), xd[r * blocks + b], cs[r * blocks + b]));
      }
  }
}

// A group of rows from r0: 3 or more rows split evenly into groups of at most kUnpackedRows leave
// at least 3 in each; the 5- and 6-bit forms take fewer rows too (kUnpackedFromRows), in one group
template <int Bits, typename P>
inline void dot_unpacked_rows_avx2(int64_t rows, const Quantized& q, int64_t r0, const UnpackedBlock<Bits>* scratch, int64_t b0,
                                   int64_t n, int64_t k, int64_t t, float* y, int64_t ldy) {
  if constexpr (Bits == 8) {
    constexpr bool kSymmetric = std::is_same_v<P, SymmetricParams>;
    switch (rows) {
      case 6: dot_unpacked_q8_avx2<6, kSymmetric>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 5: dot_unpacked_q8_avx2<5, kSymmetric>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 4: dot_unpacked_q8_avx2<4, kSymmetric>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      default: dot_unpacked_q8_avx2<3, kSymmetric>(q, r0, scratch, b0, n, k, t, y, ldy); break;
    }
  } else {
    switch (rows) {
      case 6: dot_unpacked_avx2<Bits, 6>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 5: dot_unpacked_avx2<Bits, 5>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 4: dot_unpacked_avx2<Bits, 4>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 3: dot_unpacked_avx2<Bits, 3>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      case 2: dot_unpacked_avx2<Bits, 2>(q, r0, scratch, b0, n, k, t, y, ldy); break;
      default: dot_unpacked_avx2<Bits, 1>(q, r0, scratch, b0, n, k, t, y, ldy); break;
    }
  }
}

// Tile t, every row: its codes kUnpackedChunk blocks at a time into the scratch, then the rows
// in as few groups of at most kUnpackedRows as cover them, their sizes differing by at most one
// (8 rows as 4 + 4, not 6 + 2: a group of few rows loads the codes for few maddubs)
template <int Bits, typename P>
void dot_tile_unpacked_avx2(const Quantized& q, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t, float* y,
                            int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = (rows + kUnpackedRows - 1) / kUnpackedRows, base = rows / groups, larger = rows % groups;
  UnpackedBlock<Bits> scratch[kUnpackedChunk];
  for (int64_t r = 0; r < rows; ++r) std::memset(y + r * ldy + t * kTile, 0, kTile * sizeof(float));
  for (int64_t b0 = 0; b0 < blocks; b0 += kUnpackedChunk) {
    const int64_t n = std::min(kUnpackedChunk, blocks - b0);
    unpack_tile_avx2<Bits>(codes, params, blocks, t, b0, n, scratch);
    for (int64_t g = 0, r = 0; g < groups; ++g) {
      const int64_t group_rows = base + (g < larger ? 1 : 0);
      dot_unpacked_rows_avx2<Bits, P>(group_rows, q, r, scratch, b0, n, k, t, y, ldy);
      r += group_rows;
    }
  }
}

// AVX2, 8-bit codes: half a tile (8 outputs, the low or high 32 bytes of each of the block's
// eight 64-byte registers) x R rows. maddubs would saturate on the codes u = q + 128 (255 x 127
// pairs), so the codes flip back to the file's signed q (u xor 0x80) and maddubs takes |q|
// against the activations with q's sign (llama.cpp's AVX2 Q8_0 dot): each int16 pair sum is at
// most 2 * 127 * 127 < 2^15, and a madd with ones makes each output's int32 dot of four weights.
// The 8-bit form's y = sum_b s d (u . a) + m d (sum a) is then, with u = q + 128,
// sum_b s d (q . a) + (m + 128 s) d (sum a): the second term is zero for a Q8_0 weight
// (m = -128 s exactly), and carries the minimum of any other weight in this form (Q5_x and Q6_K
// where no 5-bit loop is built). Zen 3, the default model's head against its two 4-bit terms
// (docs/measurements/zen3-avx2.md).
template <int R, typename P>
void dot_half_q8_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, int half, float* y,
                      int64_t ldy) {
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;  // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_codes = codes + (t * blocks + b) * kTileBytes<8>;  // [8, 16, 4]
    if (half == 0) prefetch_block<8>(block_codes, params, blocks, t, b, kPrefetchBlocksAvx2);  // half 1 finds them cached
    __m256i signed_codes[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      signed_codes[j] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block_codes + 64 * j + 32 * half)), flip);
    __m256 scales, mins;
    half_params<8>(params, blocks, t, b, half, scales, mins);
    const __m256 shift = _mm256_fmadd_ps(scales, _mm256_set1_ps(128.f), mins);  // m + 128 s: 0 for Q8_0
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
      acc[r] = add_q8_dot_avx2<std::is_same_v<P, SymmetricParams>>(acc[r], dot, scales, shift, xd[r * blocks + b],
                                                                  q.code_sum[(r0 + r) * blocks + b]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * ldy + t * kTile + 8 * half, acc[r]);
}

// AVX2, 5-bit codes below kUnpackedFromRows<5> rows: half a tile (8 outputs) x R rows. A block's
// codes unpack once into 8 registers of unsigned codes (the nibbles, then the fifth bits shifted
// into place and or'ed in), used by every row: maddubs against 4 broadcast activations gives int16
// pair sums of at most 2 * 31 * 127, two registers of them add without saturating, then madd with
// ones makes int32 dots; y += s d dot + m d sum a (as the 8-bit form). The 6-bit form takes the
// unpacked scratch at every row count.
template <int R, typename P>
void dot_half_q5_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, int half,
                      float* y, int64_t ldy) {
  constexpr int Bits = 5;
  const int64_t blocks = k / kBlock;
  const float* xd = q.scale.get() + r0 * blocks;       // [R, blocks]
  const float* xs = q.code_sum.get() + r0 * blocks;    // [R, blocks]
  const int8_t* a0 = q.a.get() + r0 * k;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block_codes = codes + (t * blocks + b) * kTileBytes<Bits>;  // [Bits, 16, 4]
    if (half == 0) prefetch_block<Bits>(block_codes, params, blocks, t, b, kPrefetchBlocksAvx2);  // half 1 finds them cached
    __m256i w[8];
    unpack_half_avx2<Bits>(block_codes, half, w, nullptr);
    __m256 scale, min;
    half_params<Bits>(params, blocks, t, b, half, scale, min);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* a = a0 + r * k + b * kBlock;
      __m256i dot = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {  // registers 2g, 2g + 1: weights 8g .. 8g + 7
        const __m256i x0 = _mm256_set1_epi32(four_bytes(a + 8 * g)), x1 = _mm256_set1_epi32(four_bytes(a + 8 * g + 4));
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w[2 * g], x0), _mm256_maddubs_epi16(w[2 * g + 1], x1));
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
        keep_in_register(dot);
      }
      acc[r] = add_dot_avx2(acc[r], dot, scale, min, xd[r * blocks + b], xs[r * blocks + b]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * ldy + t * kTile + 8 * half, acc[r]);
}

// Half a tile of the 4-, 5- or 8-bit form, R rows
template <int Bits, int R, typename P>
void dot_half_form_avx2(const Quantized& q, int64_t r0, const uint8_t* codes, P params, int64_t k, int64_t t, int half,
                        float* y, int64_t ldy) {
  if constexpr (Bits == 4) dot_half_avx2<R>(q, r0, codes, params, k, t, half, y, ldy);
  else if constexpr (Bits == 8) dot_half_q8_avx2<R>(q, r0, codes, params, k, t, half, y, ldy);
  else {
    static_assert(Bits == 5);
    dot_half_q5_avx2<R>(q, r0, codes, params, k, t, half, y, ldy);
  }
}

// Tile t, every row: the unpacked scratch from kUnpackedFromRows<Bits> rows (the 6-bit form's from 1:
// it has no half tiles); below, for 4-bit codes a whole tile at one or two rows, else 4 rows at a
// time per half tile, then the rest
template <int Bits, typename P>
void dot_tile_avx2(const Quantized& q, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t, float* y,
                   int64_t ldy) {
  static_assert(kUnpackedFromRows<6> == 1);  // so no 6-bit rows are left for the half tiles below
  if (rows >= kUnpackedFromRows<Bits>) {
    dot_tile_unpacked_avx2<Bits>(q, rows, codes, params, k, t, y, ldy);
    return;
  }
  if constexpr (Bits != 6) {
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
}

}  // namespace
#endif
