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
// docs/measurements/zen4.md, "The 4-bit matmul in tiles of 16 outputs").
//
// A symmetric weight (GGUF Q4_0, Q5_0, Q8_0: one d a block, codes centred, m = -2^(bits - 1) d) keeps
// its s alone, params [N/16, K/32, 1, 16]: the file's own bytes a weight (4.5, 5.5 and 8.5 bits where
// the pairs take 5, 6 and 9): the vector loops take m = -2^(bits - 1) s as they read s, the generic one
// the pairs made again per tile in a scratch (dot_tiles_of); every loop gives the pairs' bits.
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
// low 4 bits as the 4-bit form holds its codes, register 4's byte 4 n + i holding in bit j the
// fifth bit of output n's weight 4j + i. The loops unpack the nibbles as the 4-bit form does, then
// register j's fifth bits: AVX2 shifts register 4 by 4 - j, masks bit 4 and ors it in (three
// instructions, a half register at a time), VNNI tests bit j into a byte mask and adds 16 where it
// is set (two): 320 bytes a tile and block where the 8-bit form reads 512. Vectorized for AVX-512
// VNNI and AVX2; a build without either runs the scalar loop, and kspec keeps such weights in the
// 8-bit form there (engine/models/cpu_profile.py Q5Q8_ISAS).
//
// The 6-bit form (q6_q8_matmul: GGUF Q6_K weights, w = d sc (q - 32) with a scale sc per 16
// weights) holds the file's codes u = q in 0..63 and two scales a block, s0 = d sc of weights 0 .. 15
// and s1 of 16 .. 31, in the params' s and m slots (m is implied: -32 s): codes [N/16, K/32, 6, 16,
// 4] uint8, the 5-bit form's five registers then a sixth of the codes' sixth bits (as the fifth's);
// 384 bytes a tile and block where the 8-bit form (Q6_K requantized per 32) reads 512, and the
// file's weights exactly. Per row and block
//
//   y[r,n] += d[r,b] (s0[n,b] (sum_0..15 u a - 32 sum_0..15 a) + s1[n,b] (sum_16..31 u a - 32 sum_16..31 a))
//
// with the halves' sums of a kept by the activations' quantization (`Quantized::half_sums`).
// Vectorized for AVX-512 VNNI and AVX2; kspec takes it on VNNI builds only (cpu_profile.py
// Q6Q8_ISAS: on AVX2 the 8-bit form of the same weights serves the 1.5B better beside llama.cpp).
//
// Files, as ggml keeps its CPU kernels: this one holds the checks, the dispatch and the ops; the
// loops are per instruction set, q4q8/generic.h (plain C++, every build), q4q8/avx2.h,
// q4q8/avx512_vnni.h (the activations' quantization too, where it has its own loop) and q4q8/amx.h
// (groups of 16 rows on an AMX build; the VNNI loop's results bit for bit), over
// q4q8/layout.h (the forms' constants and the quantized activations' layout);
// simd.h decides which instruction sets this build has, once for every kernel file.
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

#include "q4q8/amx.h"
#include "q4q8/avx2.h"
#include "q4q8/avx512_vnni.h"
#include "q4q8/generic.h"
#include "q4q8/layout.h"
#include "simd.h"

namespace {

using at::Tensor;

void check(bool ok, const char* what) { TORCH_CHECK(ok, "kspec q4_q8_matmul: ", what); }

constexpr int64_t kQuantizeGrain = 256;  // blocks per thread's share: below, one thread quantizes

// x [rows, k] float32 as 8-bit blocks of 32 (the VNNI or AVX2 build's loop where built, else the generic one)
Quantized quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t blocks = rows * (k / kBlock);
  Quantized q{uninitialized<int8_t>(rows * k), uninitialized<float>(blocks), uninitialized<float>(blocks),
              uninitialized<float>(blocks), uninitialized<int32_t>(2 * blocks)};
  at::parallel_for(0, blocks, kQuantizeGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
#if KSPEC_Q4Q8_VNNI
      quantize_block_vnni(x + i * kBlock, q.a.get() + i * kBlock, q.scale[i], q.sum[i], q.code_sum[i], q.half_sums.get() + 2 * i);
#elif KSPEC_Q4Q8_AVX2
      quantize_block_avx2(x + i * kBlock, q.a.get() + i * kBlock, q.scale[i], q.sum[i], q.code_sum[i], q.half_sums.get() + 2 * i);
#else
      quantize_block_scalar(x + i * kBlock, q.a.get() + i * kBlock, q.scale[i], q.sum[i], q.code_sum[i], q.half_sums.get() + 2 * i);
#endif
    }
  });
  return q;
}

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
        : Bits == 6 ? "codes must be [N/16, K/32, 6, 16, 4] uint8, contiguous"
                    : "codes must be [N/16, K/32, 8, 16, 4] uint8, contiguous");
  const int64_t param_rows = params.dim() == 4 ? params.size(2) : 0;  // 2: s then m; 1: a symmetric form's s
  check(params.scalar_type() == at::kHalf && params.is_contiguous() && params.dim() == 4 &&
            params.size(0) == codes.size(0) && params.size(1) == k / kBlock && (param_rows == 2 || (param_rows == 1 && Bits != 6)) &&
            params.size(3) == kTile,
        Bits == 6 ? "params must be [N/16, K/32, 2, 16] float16, contiguous"
                  : "params must be [N/16, K/32, 2, 16] or, for a symmetric form, [N/16, K/32, 1, 16] float16, contiguous");
  Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return {y, Quantized{}};
  return {y, quantize_rows(x.data_ptr<float>(), rows, k)};
}

// Tiles t0 .. t1 - 1 of any form, every row (the VNNI loop where built, AMX's for groups of 16 rows
// where Linux lets this process use its tiles, else the AVX2 loop, else the scalar one, which reads
// pairs only)
template <int Bits, typename P>
void dot_tiles(const Quantized& q, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t0, int64_t t1, float* y,
               int64_t ldy) {
#if KSPEC_Q4Q8_AMX
  if (rows >= kAmxRows && amx_ready())
    dot_range_amx<Bits>(q, rows, codes, params, k, t0, t1, y, ldy);
  else
    dot_range_vnni<Bits>(q, 0, rows, codes, params, k, t0, t1, y, ldy);
#elif KSPEC_Q4Q8_VNNI
  dot_range_vnni<Bits>(q, 0, rows, codes, params, k, t0, t1, y, ldy);
#elif KSPEC_Q4Q8_AVX2
  for (int64_t t = t0; t < t1; ++t) dot_tile_avx2<Bits>(q, rows, codes, params, k, t, y, ldy);
#else
  for (int64_t t = t0; t < t1; ++t) dot_tile_scalar<Bits>(q, rows, codes, params.data, k, t, y, ldy);
#endif
}

// Tiles t0 .. t1 - 1 with params other than pairs: as they are on a vector build; on a generic one each
// tile's pairs made in a scratch that stays in cache (the same bits: layout.h as_pairs)
template <int Bits, typename P>
void dot_tiles_of(const Quantized& q, int64_t rows, const uint8_t* codes, P params, int64_t k, int64_t t0, int64_t t1, float* y,
                  int64_t ldy) {
#if KSPEC_Q4Q8_AVX2
  dot_tiles<Bits>(q, rows, codes, params, k, t0, t1, y, ldy);
#else
  const int64_t blocks = k / kBlock;
  auto pairs = uninitialized<c10::Half>(blocks * kParamsPerBlock);  // [blocks, 2, 16]
  for (int64_t t = t0; t < t1; ++t) {
    as_pairs<Bits>(params, blocks, t, pairs.get());
    dot_tiles<Bits>(q, rows, codes + t * blocks * kTileBytes<Bits>, PairParams{pairs.get()}, k, 0, 1, y + t * kTile, ldy);
  }
#endif
}

// Any form: y [M, N] from x and the weights in the form's layout, tiles of 16 outputs split between
// the threads; params the pairs or a symmetric form's s alone (layout.h)
template <int Bits>
Tensor matmul_form(const Tensor& x_in, const Tensor& codes, const Tensor& params) {
  const Tensor x = x_in.contiguous();
  auto [y, q] = prepare<Bits>(x, codes, params);
  const int64_t rows = y.size(0), k = x.size(1), n = y.size(1);
  if (rows == 0 || n == 0) return y;
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  float* yp = y.template data_ptr<float>();
  const c10::Half* pp = params.data_ptr<c10::Half>();
  const bool symmetric = params.size(2) == 1;
  at::parallel_for(0, n / kTile, 2, [&](int64_t t0, int64_t t1) {
    if (symmetric)
      dot_tiles_of<Bits>(q, rows, cp, SymmetricParams{pp}, k, t0, t1, yp, n);
    else
      dot_tiles<Bits>(q, rows, cp, PairParams{pp}, k, t0, t1, yp, n);
  });
  return y;
}

}  // namespace

// x [M, K] float32, codes [N/16, K/32, 4, 16, 4] uint8, params [N/16, K/32, 2, 16] float16 (or a symmetric
// form's [N/16, K/32, 1, 16]) -> y [M, N] float32
Tensor q4_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<4>(x, codes, params); }

// x [M, K] float32, codes [N/16, K/32, 8, 16, 4] uint8 (q + 128), params [N/16, K/32, 2, 16] float16 -> y [M, N] float32
Tensor q8_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<8>(x, codes, params); }

// x [M, K] float32, codes [N/16, K/32, 5, 16, 4] uint8 (the low 4 bits, then the fifth bits' masks), params as above -> y [M, N] float32
Tensor q5_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<5>(x, codes, params); }

// x [M, K] float32, codes [N/16, K/32, 6, 16, 4] uint8 (the low 4 bits, the fifth bits' masks, the sixth's), params
// [N/16, K/32, 2, 16] float16 (the halves' scales) -> y [M, N] float32
Tensor q6_q8_matmul(const Tensor& x, const Tensor& codes, const Tensor& params) { return matmul_form<6>(x, codes, params); }

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

// The fewest rows this build multiplies on AMX, 0 where it does not (no AMX in the build, or Linux
// refused this process the tiles' state)
int64_t q4_q8_amx_rows() {
#if KSPEC_Q4Q8_AMX
  return amx_ready() ? kAmxRows : 0;
#else
  return 0;
#endif
}

TORCH_LIBRARY_FRAGMENT(kspec, m) {
  m.def("q4_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q8_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q5_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q6_q8_matmul(Tensor x, Tensor codes, Tensor params) -> Tensor");
  m.def("q4_q8_isa() -> str", q4_q8_isa);
  m.def("q4_q8_amx_rows() -> int", q4_q8_amx_rows);
}

TORCH_LIBRARY_IMPL(kspec, CPU, m) {
  m.impl("q4_q8_matmul", q4_q8_matmul);
  m.impl("q8_q8_matmul", q8_q8_matmul);
  m.impl("q5_q8_matmul", q5_q8_matmul);
  m.impl("q6_q8_matmul", q6_q8_matmul);
}
