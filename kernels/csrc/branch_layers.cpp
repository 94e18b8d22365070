// Every decoder layer of one branch step in C++: the CPU fast path's decode loop without Python
// between ops (kernels/cpu_layers.py builds and calls it; engine/models/native_step.py says when).
//
// A decode step of the default model runs ~35 ATen ops per layer at 2-5 us of Python and
// dispatch each, more than the 4-bit matmuls themselves at one row. Here a layer is four 4-bit
// matmuls (q|k|v, o, gate|up or StarCoder2's c_fc, down or c_proj) and loops over the few rows of
// the step for the rest: RMSNorm or LayerNorm (StarCoder2), Qwen3's per-head q/k norms, the
// projections' biases, rotary, the KV writes, bifurcated attention, the SiLU-gated MLP or
// StarCoder2's GELU one (`NormKind`, `MlpKind`), residual adds. The
// matmuls are the weights' own kernel: PyTorch's int4 one (aten::_weight_int4pack_mm_for_cpu,
// AVX-512 CPUs) or kspec's 4-bit x 8-bit one (q4_q8_matmul.cpp, AVX2, Zen 4 and Zen 5 CPUs: cpu_fast.py).
//
// Numbers as in the PyTorch fast path: the residual stream, norms, rotary, attention and KV in
// float32; the matmuls' inputs and outputs bfloat16 for PyTorch's kernel (the gate's SiLU times
// up is rounded to bfloat16 once; PyTorch rounds after the SiLU and after the product; a bias is
// added to the rounded output in float32, as CpuLinear adds it), float32 for kspec's.
//
// Attention (the contract of kernels/contract.py, no sliding window): query t of branch b sees
// every prefix key and its branch's entries j < len_b + t + 1 (len_b: entries before this
// step). On an AVX-512 or AVX2 build with heads of 64 or 128 it is written out (`attend_direct`,
// `attend_lanes`: one softmax over a query's prefix and branch scores, nothing to merge);
// elsewhere two calls of PyTorch's CPU flash kernel and a log-sum-exp merge, as
// kernels/cpu_fused.py. Why written out, with the measurements on Zen 4 and Zen 3:
// docs/measurements/kernels-log.md.
//
// Files, as the matmul's (q4_q8_matmul.cpp): this one holds the layer loop, its checks, the
// attention's dispatch and the ops; the attention's loops are in attention/: common.h (its
// inputs, the prefix's pieces and float16 rows, shared by every build), generic.h (plain C++:
// one query row at a time), lanes.h (tiles of queries in register lanes, written once over
// `Lanes`), avx512.h and avx2.h (each instruction set's `Lanes`, float16 conversion and, on AVX2,
// the one-row blocks for heads of 64); simd.h decides which of them this build has.
//
// The prompt's KV (the prefix) may be float16 (`--cpu-kv`, engine/models/cpu_fast.py): the
// attention converts it a chunk of rows at a time into an L1 scratch and multiplies float32.
// One row (attend_direct) takes a chunk's keys 8 at a time against each query head, q in 8
// registers, the 8 dots' lanes summed together (AVX2, heads of 64: score_rows64), and weighs
// values with the output in 8 registers (measured: docs/measurements/kernels-log.md).
//
// bfloat16 is handled as its bits (uint16_t) so that the loops vectorize: c10::BFloat16's
// conversions keep them scalar.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention/common.h"
#include "attention/generic.h"
#include "attention/lanes.h"
#include "exp.h"
#include "simd.h"

at::Tensor q4_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp
at::Tensor q8_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp
at::Tensor q5_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp
at::Tensor q6_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp

namespace {

using at::Tensor;
using bf16 = uint16_t;  // a bfloat16's bits

// float -> bfloat16, rounded to nearest even (NaN stays NaN), as c10::BFloat16 rounds
inline bf16 to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<bf16>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

inline float from_bf16(bf16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

bf16* bf16_data(const Tensor& t) { return reinterpret_cast<bf16*>(t.data_ptr<c10::BFloat16>()); }

// The matmuls' inputs and outputs: bfloat16 bits for PyTorch's int4 kernel, float32 for kspec's
// 4-bit x 8-bit one (q4_q8_matmul.cpp), which quantizes its float32 input itself.
inline bf16 to_act(float f, bf16*) { return to_bf16(f); }
inline float to_act(float f, float*) { return f; }
inline float from_act(bf16 b) { return from_bf16(b); }
inline float from_act(float f) { return f; }
template <typename Act> Act* act_data(const Tensor& t);
template <> bf16* act_data<bf16>(const Tensor& t) { return bf16_data(t); }
template <> float* act_data<float>(const Tensor& t) { return t.data_ptr<float>(); }
template <typename Act> constexpr at::ScalarType act_type = std::is_same_v<Act, float> ? at::kFloat : at::kBFloat16;

constexpr int64_t kGroup = 32;         // weights per 4-bit group (GGUF Q4 blocks)
constexpr int64_t kMaxHeadDim = 512;

// x / (1 + e^-x), from e^-|x| so that the exponent is never positive
inline float silu(float x) {
  const float t = exp_nonpositive(-std::fabs(x));
  return (x >= 0.f ? x : x * t) / (1.f + t);
}

// out = silu(gate) * up, rounded once (to bfloat16)
template <typename Act>
void silu_times(const Act* __restrict gate, const Act* __restrict up, Act* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = to_act(silu(from_act(gate[i])) * from_act(up[i]), out);
}

// GELU, tanh approximation (nn.GELU(approximate="tanh"), StarCoder2's gelu_pytorch_tanh):
// x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); the sigmoid from
// e^-|2u| as in silu, so that the exponent is never positive and the loop vectorizes
inline float gelu_tanh(float x) {
  const float z = 1.5957691216057308f * (x + 0.044715f * x * x * x);  // 2u
  const float t = exp_nonpositive(-std::fabs(z));
  return (z >= 0.f ? x : x * t) / (1.f + t);
}

// out = gelu_tanh(y + bias), y rounded as the matmul gave it, the sum float32; rounded once
template <typename Act>
void gelu_of_biased(const Act* __restrict y, const float* __restrict bias, Act* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = to_act(gelu_tanh(from_act(y[i]) + bias[i]), out);
}

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, x [rows, n] float32, rounded once (to bfloat16)
template <typename Act>
void rms_norm_to(const float* x, const float* w, Act* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
    Act* o = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = to_act(xr[i] * inv * w[i], o);
  }
}

// out[r] = (x[r] - mean) / sqrt(var + eps) * w + b (nn.LayerNorm: biased variance, two passes),
// x [rows, n] float32, rounded once (to bfloat16)
template <typename Act>
void layer_norm_to(const float* x, const float* w, const float* b, Act* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += xr[i];
    const float mean = sum / static_cast<float>(n);
    float squares = 0.f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < n; ++i) squares += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
    Act* o = out + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = to_act((xr[i] - mean) * inv * w[i] + b[i], o);
  }
}

// The decoder's norms: RMSNorm (llama family) or LayerNorm with a bias (StarCoder2).
// norm_to, add_biased_to and mlp_hidden are noinline: inlined into the layer loop, they change
// how GCC compiles the q|k|v loop beside them, and with it the order of Qwen3's q/k norm sums on
// an AVX2 build (one ulp, which the 8-bit activations carry to 6 % of a test's scale); out of
// line, the q|k|v loop compiles as it does without the LayerNorm and GELU kinds. The q|k|v loop
// itself stays in the layer loop for the same reason: moved into a function of its own, the
// generic (x86-64) build sums Qwen3's q/k norms in another order. One call per layer and row
// block: nothing to measure.
enum class NormKind { rms, layer };

NormKind norm_kind(const std::string& name) {
  TORCH_CHECK(name == "rms" || name == "layer", "kspec branch_layers: norm must be rms or layer, got ", name);
  return name == "rms" ? NormKind::rms : NormKind::layer;
}

// x [rows, n] through the layer's norm (weights w, bias b: LayerNorm's) into out, rounded once
template <typename Act>
__attribute__((noinline)) void norm_to(NormKind kind, const float* x, const float* w, const float* b, Act* out, int64_t rows, int64_t n, float eps) {
  if (kind == NormKind::rms) return rms_norm_to(x, w, out, rows, n, eps);
  layer_norm_to(x, w, b, out, rows, n, eps);
}

// One head's values [D] through RMSNorm over D, in place: v * rsqrt(mean(v^2) + eps) * w
inline void head_rms_norm(float* v, const float* w, int64_t n, float eps) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) squares += v[i] * v[i];
  const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] * inv * w[i];
}

template <typename Act>
void add_to(float* x, const Act* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += from_act(y[i]);
}

// x [rows, n] += y + bias (bias [n] or none), y + bias first: CpuLinear's output, then the residual add
template <typename Act>
__attribute__((noinline)) void add_biased_to(float* x, const Act* y, const float* bias, int64_t rows, int64_t n) {
  if (bias == nullptr) return add_to(x, y, rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const Act* yr = y + r * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) xr[i] += from_act(yr[i]) + bias[i];
  }
}

// The MLP: SiLU(gate) * up of one gate|up matmul (llama family), or GELU (tanh) of StarCoder2's
// c_fc with its bias; then the down projection (c_proj)
enum class MlpKind { silu_gated, gelu_tanh };

MlpKind mlp_kind(const std::string& name) {
  TORCH_CHECK(name == "silu_gated" || name == "gelu_tanh", "kspec branch_layers: mlp must be silu_gated or gelu_tanh, got ", name);
  return name == "silu_gated" ? MlpKind::silu_gated : MlpKind::gelu_tanh;
}

// The first matmul's output [rows, 2 I] (gate | up) or [rows, I] (c_fc, bias [I]) -> the down
// projection's input [rows, I]
template <typename Act>
__attribute__((noinline)) Tensor mlp_hidden(MlpKind kind, const Tensor& first, const float* bias) {
  const int64_t rows = first.size(0), inter = kind == MlpKind::silu_gated ? first.size(1) / 2 : first.size(1);
  Tensor hidden = at::empty({rows, inter}, first.options());  // [R, I]
  const Act* in = act_data<Act>(first);
  Act* out = act_data<Act>(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    if (kind == MlpKind::silu_gated) {
      const Act* gate = in + r * 2 * inter;
      silu_times(gate, gate + inter, out + r * inter, inter);
    } else {
      gelu_of_biased(in + r * inter, bias, out + r * inter, inter);
    }
  }
  return hidden;
}

struct Dims {
  int64_t rows, dim, heads, kv_heads, head_dim, n_new, branches, capacity;
  const int64_t* padded_rows = nullptr;  // [R] the rows computed of the k T padded ones; nullptr: all
  int64_t padded(int64_t r) const { return padded_row(padded_rows, r); }
};

// The written-out attention where this build and these inputs have it (true), else false. With
// the prefix in several pieces, each piece's output is kept with its maximum score and sum of
// weights, then the pieces are joined: o = sum_p e^(top_p - top) o_p over sum_p e^(top_p - top) sum_p.
template <typename Act, typename KV>
bool attend_written_out(const AttentionInputs<KV>& in, int64_t D, Act* out) {
#if KSPEC_LANES_ATTENTION
  if ((D != 64 && D != 128) || in.group() > kMaxGroup) return false;
  const bool lanes = in.rows * in.group() >= kLanesFromQueries, wide = wide_tiles(in);
  const int64_t tiles = wide ? query_tiles<kWideTileRegs>(in) : query_tiles<1>(in);
  const int64_t items = in.kv_heads * (lanes ? tiles : in.rows);  // before cutting the prefix
  const PrefixPieces pieces = PrefixPieces::balancing(items, in.prefix, at::get_num_threads());
  const int64_t queries = in.rows * in.heads;
  std::vector<float> part_o(pieces.count > 1 ? queries * pieces.count * D : 0);  // [R H, pieces, D]
  std::vector<float> part_top(pieces.count > 1 ? queries * pieces.count : 0);  // [R H, pieces]
  std::vector<float> part_sum(part_top.size());
  auto emit = [&](int64_t r, int64_t h, int64_t piece, const float* o, float top, float sum) {
    if (pieces.count == 1) {
      Act* dst = out + (r * in.heads + h) * D;
      const float inv = 1.f / sum;
      for (int64_t d = 0; d < D; ++d) dst[d] = to_act(o[d] * inv, dst);
      return;
    }
    const int64_t at = (r * in.heads + h) * pieces.count + piece;
    std::copy(o, o + D, part_o.data() + at * D);
    part_top[at] = top;
    part_sum[at] = sum;
  };
  if (!lanes) D == 64 ? attend_direct<64>(in, pieces, emit) : attend_direct<128>(in, pieces, emit);
  else if (wide) D == 64 ? attend_lanes<64, kWideTileRegs>(in, pieces, emit) : attend_lanes<128, kWideTileRegs>(in, pieces, emit);
  else D == 64 ? attend_lanes<64, 1>(in, pieces, emit) : attend_lanes<128, 1>(in, pieces, emit);
  for (int64_t i = 0; i < (pieces.count > 1 ? queries : 0); ++i) {
    const float* tops = part_top.data() + i * pieces.count;
    const float top = *std::max_element(tops, tops + pieces.count);  // finite: the last piece holds the query's own entry
    float o[kMaxHeadDim] = {}, sum = 0.f;
    for (int64_t p = 0; p < pieces.count; ++p) {
      const float weight = std::exp(tops[p] - top);  // 0 for a piece that saw no key (top -inf)
      sum += weight * part_sum[i * pieces.count + p];
      const float* po = part_o.data() + (i * pieces.count + p) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += weight * po[d];
    }
    Act* dst = out + i * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = to_act(o[d] / sum, dst);
  }
  return true;
#else
  (void)in, (void)D, (void)out;
  return false;
#endif
}

// Bifurcated attention of one layer through PyTorch's CPU flash kernel, as
// kernels/cpu_fused.py does it: queries [R, H, D] (float32) of every branch as the rows of ONE
// batch against the single copy of the prefix [1, Hkv, P, D], each branch's queries against
// its own entries [k, Hkv, cols, D], merged by their log-sum-exps into out [R, H * D].
template <typename Act>
void attend_layer(const Dims& s, const Tensor& queries, const Tensor& prefix_k, const Tensor& prefix_v,
                  const Tensor& branch_k, const Tensor& branch_v, int64_t cols, const std::optional<Tensor>& mask,
                  Act* out) {
  const int64_t H = s.heads, D = s.head_dim, T = s.n_new;
  const bool float_mask = !mask.has_value() || (mask->scalar_type() == at::kFloat && mask->is_contiguous());
  if (float_mask) {
    auto written_out = [&]<typename KV>(const KV* keys, const KV* values) {
      const AttentionInputs<KV> in{s.rows, H, s.kv_heads, T, prefix_k.size(2), s.capacity, cols, prefix_k.stride(1), prefix_k.stride(2),
                                   queries.data_ptr<float>(), keys, values, branch_k.data_ptr<float>(), branch_v.data_ptr<float>(),
                                   mask.has_value() ? mask->data_ptr<float>() : nullptr, s.padded_rows};
      return attend_written_out(in, D, out);
    };
    const bool half = prefix_k.scalar_type() == at::kHalf;
    if (half ? written_out(f16_data(prefix_k), f16_data(prefix_v)) : written_out(prefix_k.data_ptr<float>(), prefix_v.data_ptr<float>()))
      return;
  }
  Tensor padded_q = queries;  // [k T, H, D]: the computed rows in their places, zeros elsewhere
  if (s.padded_rows) {
    const Tensor places = at::from_blob(const_cast<int64_t*>(s.padded_rows), {s.rows}, at::kLong);
    padded_q = at::zeros({s.branches * T, H, D}, queries.options()).index_copy_(0, places, queries);
  }
  Tensor branch_q = padded_q.view({s.branches, T, H, D}).transpose(1, 2);  // [k, H, T, D]
  auto [out_b, lse_b] = at::_scaled_dot_product_flash_attention_for_cpu(
      branch_q, branch_k.narrow(2, 0, cols), branch_v.narrow(2, 0, cols), 0.0, false, mask);
  // out_b [k, H, T, D], lse_b [k, H, T]
  const bool has_prefix = prefix_k.size(2) > 0;
  Tensor out_p, lse_p;
  if (has_prefix) {
    Tensor rows = queries.permute({1, 0, 2}).unsqueeze(0);  // [1, H, R, D]
    std::tie(out_p, lse_p) = at::_scaled_dot_product_flash_attention_for_cpu(rows, prefix_k.to(at::kFloat), prefix_v.to(at::kFloat));
  }  // out_p [1, H, R, D], lse_p [1, H, R]
  TORCH_CHECK(out_b.stride(3) == 1 && (!has_prefix || out_p.stride(3) == 1), "kspec branch_layers: flash output rows not contiguous");
  auto ob = out_b.accessor<float, 4>();
  auto lb = lse_b.accessor<float, 3>();
  const float* shared_base = has_prefix ? out_p.data_ptr<float>() : nullptr;
  const Tensor lse_rows = has_prefix ? lse_p.contiguous() : lse_p;  // [1, H, R]
  const float* lse_shared = has_prefix ? lse_rows.data_ptr<float>() : nullptr;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t p = s.padded(r), b = p / T, t = p % T;
    for (int64_t h = 0; h < H; ++h) {
      Act* o = out + (r * H + h) * D;
      const float* own = &ob[b][h][t][0];
      if (!has_prefix) {
        for (int64_t d = 0; d < D; ++d) o[d] = to_act(own[d], o);
        continue;
      }
      const float* shared = shared_base + h * out_p.stride(1) + r * out_p.stride(2);
      // e^lse_p / (e^lse_p + e^lse_b), from the difference so that nothing overflows
      const float share = 1.f / (1.f + std::exp(lb[b][h][t] - lse_shared[h * s.rows + r]));
      for (int64_t d = 0; d < D; ++d) o[d] = to_act(own[d] + share * (shared[d] - own[d]), o);
    }
  }
}

// x [R, K] -> [R, N] through the weights' kernel: bfloat16 in and out of PyTorch's int4 one
// (packed, scales_zeros in its layout), float32 of kspec's (codes, params of q4_q8_matmul.cpp:
// its forms' codes are [N/16, K/32, R, 16, 4] with R = 4, 5, 6 or 8 registers for 4-, 5-, 6- and
// 8-bit codes, so a layer may mix them: a Q4_K_M file's Q6_K down projections beside Q4_K ones)
Tensor matmul(const Tensor& x, const Tensor& packed, const Tensor& scales) {
  if (x.scalar_type() == at::kFloat) {
    const int64_t registers = packed.dim() == 5 ? packed.size(2) : 4;
    switch (registers) {
      case 8: return q8_q8_matmul(x, packed, scales);
      case 6: return q6_q8_matmul(x, packed, scales);
      case 5: return q5_q8_matmul(x, packed, scales);
      default: return q4_q8_matmul(x, packed, scales);
    }
  }
  return at::_weight_int4pack_mm_for_cpu(x, packed, kGroup, scales);
}

void check(bool ok, const char* what) { TORCH_CHECK(ok, "kspec branch_layers: ", what); }

// The prompt's KV, float32 or float16 (keys and values alike)
void check_prefix_type(const Tensor& prefix_k, const Tensor& prefix_v) {
  const auto type = prefix_k.scalar_type();
  check((type == at::kFloat || type == at::kHalf) && prefix_v.scalar_type() == type, "prefix KV must be float32 or float16, keys and values alike");
}

// The rows a step computes: all k T (padded_rows empty) or, in order, the places among them of
// each branch's first few new tokens (a verification's rows without the padding of drafts
// shorter than the longest, which no query attends to); sets s.padded_rows, checks s.rows, the
// branch buffers' room and the mask's shape; returns the branch keys any query sees (cols)
int64_t check_rows(Dims& s, at::IntArrayRef padded_rows, at::IntArrayRef lengths, const std::optional<Tensor>& mask) {
  const int64_t T = s.n_new;
  check(s.branches > 0 && T > 0, "no branches or no new tokens");
  if (padded_rows.empty()) {
    check(s.rows == s.branches * T, "rows must be k * T without padded_rows");
  } else {
    check(static_cast<int64_t>(padded_rows.size()) == s.rows && s.rows > 0, "one padded row per row");
    for (int64_t r = 0; r < s.rows; ++r) {
      const int64_t p = padded_rows[r];
      check(p >= 0 && p < s.branches * T && (r == 0 || p > padded_rows[r - 1]), "padded rows must increase within k * T");
      check(p % T == 0 || (r > 0 && padded_rows[r - 1] == p - 1), "each branch's rows must be its first new tokens");
    }
    s.padded_rows = padded_rows.data();
  }
  for (int64_t b = 0; b < s.branches; ++b) check(lengths[b] >= 0 && lengths[b] + T <= s.capacity, "a branch outgrows its buffer");
  const int64_t cols = *std::max_element(lengths.begin(), lengths.end()) + T;
  check(!mask.has_value() || (mask->dim() == 4 && mask->size(0) == s.branches && mask->size(2) == T && mask->size(3) == cols),
        "the branch mask must be [k, 1, T, max(lengths) + T]");
  return cols;
}

// The per-layer tensor lists of LoopModel, each named once here (X(name), in the constructor's
// order): its fields, its constructor's parameters and their names
#define KSPEC_LAYER_TENSORS(X)                                                                                        \
  X(input_norm) X(input_norm_bias) X(qkv_packed) X(qkv_scales) X(qkv_bias) X(q_norm) X(k_norm) X(o_packed) X(o_scales) \
  X(o_bias) X(post_norm) X(post_norm_bias) X(gate_up_packed) X(gate_up_scales) X(gate_up_bias) X(down_packed)         \
  X(down_scales) X(down_bias)

// What the layer loop reads of a model, built once per model (engine/models/native_step.py) and
// checked then. Per layer l, in layer order: input and post-attention norm weights [dim] (and
// biases [dim]: norm "layer", LayerNorm; none: "rms"); the 4-bit kernel's packed weights and
// scales of q|k|v, o, the MLP's first matmul (mlp "silu_gated": gate|up [2 I]; "gelu_tanh": c_fc
// [I]) and down (c_proj); the q|k|v bias [(H + 2 Hkv) D] or none; the per-head RMSNorm weights
// of q and of k [D] (Qwen3's q_norm / k_norm, before rotary) or none; the biases of o [dim], of
// the first MLP matmul [I] (gelu_tanh only) and of down [dim], each one per layer or none. Then
// the query and kv heads, the norms' eps and the norm and MLP kinds.
struct LoopModel : torch::CustomClassHolder {
  using Tensors = std::vector<Tensor>;
#define KSPEC_FIELD(name) Tensors name;
  KSPEC_LAYER_TENSORS(KSPEC_FIELD)
#undef KSPEC_FIELD
  int64_t heads, kv_heads;
  double eps;
  NormKind norm;
  MlpKind mlp;

#define KSPEC_PARAMETER(name) Tensors name,
#define KSPEC_INITIALIZER(name) name(std::move(name)),
  LoopModel(KSPEC_LAYER_TENSORS(KSPEC_PARAMETER) int64_t heads, int64_t kv_heads, double eps, const std::string& norm, const std::string& mlp)
      : KSPEC_LAYER_TENSORS(KSPEC_INITIALIZER) heads(heads), kv_heads(kv_heads), eps(eps), norm(norm_kind(norm)), mlp(mlp_kind(mlp)) {
    check_weights();
  }
#undef KSPEC_PARAMETER
#undef KSPEC_INITIALIZER

  int64_t layers() const { return static_cast<int64_t>(input_norm.size()); }
  int64_t dim() const { return input_norm[0].numel(); }

  // Layer l's tensor of a list that holds one per layer or none: its floats, or nullptr
  static const float* optional(const Tensors& per_layer, int64_t l) { return per_layer.empty() ? nullptr : per_layer[l].data_ptr<float>(); }

  void check_weights() const {
    const int64_t layers = this->layers();
    check(layers > 0, "no layers");
    for (const Tensors* every :
         {&qkv_packed, &qkv_scales, &o_packed, &o_scales, &post_norm, &gate_up_packed, &gate_up_scales, &down_packed, &down_scales})
      check(static_cast<int64_t>(every->size()) == layers, "one of each norm and each projection's weights per layer");
    for (const Tensors* norms : {&input_norm, &post_norm})
      for (const Tensor& w : *norms)
        check(w.scalar_type() == at::kFloat && w.numel() == dim() && w.is_contiguous(), "norm weights must be [dim] float32");
    check(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "heads do not fit");
    check(qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == layers, "one q|k|v bias per layer or none");
    check(q_norm.size() == k_norm.size() && (q_norm.empty() || static_cast<int64_t>(q_norm.size()) == layers),
          "one q norm and one k norm per layer or none");
    for (const Tensors* norms : {&q_norm, &k_norm})
      for (const Tensor& w : *norms)
        check(w.scalar_type() == at::kFloat && w.dim() == 1 && w.numel() == q_norm[0].numel(), "q and k norm weights must be [D] float32");
    const bool layer_norm = norm == NormKind::layer;
    check(static_cast<int64_t>(input_norm_bias.size()) == (layer_norm ? layers : 0) && post_norm_bias.size() == input_norm_bias.size(),
          "norm biases: one per layer for LayerNorm, none for RMSNorm");
    for (const Tensors* biases : {&input_norm_bias, &post_norm_bias, &o_bias, &down_bias})
      for (const Tensor& b : *biases)
        check(b.scalar_type() == at::kFloat && b.numel() == dim() && b.is_contiguous(), "norm, o and down biases must be [dim] float32");
    for (const Tensors* biases : {&o_bias, &down_bias})
      check(biases->empty() || static_cast<int64_t>(biases->size()) == layers, "one o / down bias per layer or none");
    check(static_cast<int64_t>(gate_up_bias.size()) == (mlp == MlpKind::gelu_tanh ? layers : 0),
          "the first MLP matmul's bias: one per layer for gelu_tanh (c_fc), none for silu_gated");
    for (const Tensor& b : gate_up_bias) check(b.scalar_type() == at::kFloat && b.dim() == 1 && b.is_contiguous(), "c_fc biases must be [I] float32");
  }
};

// The step's inputs against the model: x [R, dim] float32, the caches' shapes and types, the
// rows (check_rows); sets the step's Dims s, returns the branch keys any query sees
int64_t check_step(Dims& s, const LoopModel& m, int64_t layers, const Tensor& x, const Tensor& cos, const Tensor& signed_sin,
                   const Tensor& prefix_k, const Tensor& prefix_v, const Tensor& branch_k, const Tensor& branch_v,
                   const std::optional<Tensor>& branch_mask, at::IntArrayRef lengths, at::IntArrayRef padded_rows, int64_t n_new) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) == m.dim(), "x must be [R, dim] float32");
  check(branch_k.dim() == 5 && branch_k.is_contiguous() && branch_v.is_contiguous(), "branch buffers must be contiguous [L, k, Hkv, S, D]");
  check(branch_k.scalar_type() == at::kFloat && branch_v.scalar_type() == at::kFloat, "the branch buffers must be float32");
  check_prefix_type(prefix_k, prefix_v);
  check(prefix_k.dim() == 5 && prefix_k.stride(4) == 1 && prefix_v.strides() == prefix_k.strides(), "prefix KV must be [L, 1, Hkv, P, D] with unit last stride");
  check(branch_k.size(0) >= layers && prefix_k.size(0) >= layers, "fewer cache layers than weights");
  s.rows = x.size(0);
  s.dim = x.size(1);
  s.heads = m.heads;
  s.kv_heads = m.kv_heads;
  s.head_dim = branch_k.size(4);
  s.n_new = n_new;
  s.branches = static_cast<int64_t>(lengths.size());
  s.capacity = branch_k.size(3);
  check(m.q_norm.empty() || m.q_norm[0].numel() == s.head_dim, "q and k norm weights must be [D] float32");
  check(s.head_dim % 2 == 0, "heads or head size do not fit");
  check(s.head_dim <= kMaxHeadDim, "head size above 512");
  check(cos.sizes() == signed_sin.sizes() && cos.size(0) == s.rows && cos.size(1) == s.head_dim, "cos/sin must be [R, D]");
  return check_rows(s, padded_rows, lengths, branch_mask);
}

}  // namespace

// One branch step through the model's first n_layers layers (all of them: none).
// x [R, dim] float32 (R = k * T rows, row r: branch r / T, new token r % T; or the rows at
// padded_rows of those, see check_rows); cos, signed sin [R, D] float32 (engine/models/rope.py:
// rotate_half folded into a roll and a signed sin).
// prefix_k/v [L, 1, Hkv, P, D] float32 or float16 (unit last stride), branch_k/v [L, k, Hkv, S, D]
// float32 contiguous, written at slots lengths[b] + t; branch_mask the branch piece's additive mask [k, 1, T, cols]
// (kernels/contract.py BranchLayout: the masking rules are written once, there) or none.
// Returns the residual stream after the last layer [R, dim].
Tensor branch_layers(const c10::intrusive_ptr<LoopModel>& model, const Tensor& x_in, const Tensor& cos, const Tensor& signed_sin,
                     const Tensor& prefix_k, const Tensor& prefix_v, const Tensor& branch_k, const Tensor& branch_v,
                     const std::optional<Tensor>& branch_mask, at::IntArrayRef lengths, at::IntArrayRef padded_rows, int64_t n_new,
                     std::optional<int64_t> n_layers) {
  const LoopModel& m = *model;
  check(!n_layers.has_value() || *n_layers > 0, "no layers");
  const int64_t layers = n_layers.has_value() ? std::min(*n_layers, m.layers()) : m.layers();
  Dims s{};
  const int64_t cols = check_step(s, m, layers, x_in, cos, signed_sin, prefix_k, prefix_v, branch_k, branch_v, branch_mask, lengths,
                                  padded_rows, n_new);  // branch keys any query sees
  const int64_t heads = m.heads, kv_heads = m.kv_heads;
  const int64_t D = s.head_dim, half = D / 2, qkv_width = (heads + 2 * kv_heads) * D;
  const float eps = static_cast<float>(m.eps);

  // The weights' kernel decides the matmuls' activations: bfloat16 scales are PyTorch's int4 kernel's
  // (bfloat16), any other params kspec's 4-bit x 8-bit kernel's (float32 in and out).
  const bool float_matmul = m.qkv_scales[0].scalar_type() != at::kBFloat16;
  auto run = [&]<typename Act>() {
    Tensor x = x_in.contiguous().clone();  // [R, dim] the residual stream
    Tensor normed = at::empty({s.rows, s.dim}, x.options().dtype(act_type<Act>));  // [R, dim]
    Tensor attn = at::empty({s.rows, heads * D}, normed.options());  // [R, H * D]
    Tensor queries = at::empty({s.rows, heads, D}, x.options());  // [R, H, D] rotated
    Tensor cos_c = cos.contiguous(), sin_c = signed_sin.contiguous();
    float* xp = x.data_ptr<float>();
    float* qp = queries.data_ptr<float>();
    const float* cp = cos_c.data_ptr<float>();
    const float* sp = sin_c.data_ptr<float>();
    const int64_t cache_layer = branch_k.stride(0);
    for (int64_t l = 0; l < layers; ++l) {
      norm_to(m.norm, xp, m.input_norm[l].data_ptr<float>(), LoopModel::optional(m.input_norm_bias, l), act_data<Act>(normed), s.rows, s.dim, eps);
      Tensor qkv = matmul(normed, m.qkv_packed[l], m.qkv_scales[l]);  // [R, (H + 2 Hkv) D]
      const Act* proj = act_data<Act>(qkv);
      const float* bias = LoopModel::optional(m.qkv_bias, l);
      const float* qn = LoopModel::optional(m.q_norm, l);
      const float* kn = LoopModel::optional(m.k_norm, l);
      float* bk = branch_k.data_ptr<float>() + l * cache_layer;
      float* bv = branch_v.data_ptr<float>() + l * cache_layer;
      for (int64_t r = 0; r < s.rows; ++r) {  // rotary on q and k, k and v into the branch buffers
        const int64_t p = s.padded(r), b = p / n_new, slot = lengths[b] + p % n_new;
        const float* c = cp + r * D;
        const float* sn = sp + r * D;
        for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
          const Act* src = proj + r * qkv_width + h * D;
          const float* bias_h = bias ? bias + h * D : nullptr;
          float value[kMaxHeadDim];
          for (int64_t i = 0; i < D; ++i) value[i] = from_act(src[i]);
          if (bias_h)
            for (int64_t i = 0; i < D; ++i) value[i] += bias_h[i];
          if (qn != nullptr && h < heads + kv_heads) head_rms_norm(value, h < heads ? qn : kn, D, eps);
          if (h >= heads + kv_heads) {
            std::memcpy(bv + ((b * kv_heads + h - heads - kv_heads) * s.capacity + slot) * D, value, D * sizeof(float));
            continue;
          }
          float* dst = h < heads ? qp + (r * heads + h) * D : bk + ((b * kv_heads + h - heads) * s.capacity + slot) * D;
          for (int64_t i = 0; i < half; ++i) dst[i] = value[i] * c[i] + value[i + half] * sn[i];  // roll by D/2
          for (int64_t i = half; i < D; ++i) dst[i] = value[i] * c[i] + value[i - half] * sn[i];
        }
      }
      attend_layer(s, queries, prefix_k[l], prefix_v[l], branch_k[l], branch_v[l], cols, branch_mask, act_data<Act>(attn));
      add_biased_to(xp, act_data<Act>(matmul(attn, m.o_packed[l], m.o_scales[l])), LoopModel::optional(m.o_bias, l), s.rows, s.dim);
      norm_to(m.norm, xp, m.post_norm[l].data_ptr<float>(), LoopModel::optional(m.post_norm_bias, l), act_data<Act>(normed), s.rows, s.dim, eps);
      Tensor first = matmul(normed, m.gate_up_packed[l], m.gate_up_scales[l]);  // [R, 2 I] gate | up, or [R, I] c_fc
      const float* first_bias = LoopModel::optional(m.gate_up_bias, l);
      check(first_bias == nullptr || m.gate_up_bias[l].numel() == first.size(1), "a c_fc bias must be [I]");
      Tensor hidden = mlp_hidden<Act>(m.mlp, first, first_bias);  // [R, I]
      add_biased_to(xp, act_data<Act>(matmul(hidden, m.down_packed[l], m.down_scales[l])), LoopModel::optional(m.down_bias, l), s.rows, s.dim);
    }
    return x;
  };
  return float_matmul ? run.template operator()<float>() : run.template operator()<bf16>();
}

// One layer's attention as branch_layers runs it (the tests hold it to the contract's reference):
// queries [R, H, D] float32 (rotated, unscaled; row r: branch r / T, token r % T); prefix_k/v
// [1, Hkv, P, D] float32 or float16 (unit last stride, equal strides); branch_k/v [k, Hkv, S, D] contiguous, holding
// this step's entries at lengths[b] + t; branch_mask and padded_rows as branch_layers' -> [R, H * D] float32
Tensor branch_attention(const Tensor& queries, const Tensor& prefix_k, const Tensor& prefix_v, const Tensor& branch_k,
                        const Tensor& branch_v, const std::optional<Tensor>& branch_mask, at::IntArrayRef lengths,
                        at::IntArrayRef padded_rows, int64_t n_new) {
  check(queries.dim() == 3 && queries.scalar_type() == at::kFloat, "queries must be [R, H, D] float32");
  check(branch_k.dim() == 4 && branch_k.is_contiguous() && branch_v.is_contiguous() && branch_k.scalar_type() == at::kFloat,
        "branch buffers must be contiguous [k, Hkv, S, D] float32");
  check(prefix_k.dim() == 4 && prefix_k.stride(3) == 1 && prefix_v.strides() == prefix_k.strides(),
        "prefix KV must be [1, Hkv, P, D] with unit last stride");
  check_prefix_type(prefix_k, prefix_v);
  Dims s{};
  s.rows = queries.size(0);
  s.heads = queries.size(1);
  s.kv_heads = branch_k.size(1);
  s.head_dim = queries.size(2);
  s.dim = s.heads * s.head_dim;
  s.n_new = n_new;
  s.branches = static_cast<int64_t>(lengths.size());
  s.capacity = branch_k.size(2);
  check(s.heads % s.kv_heads == 0, "heads do not fit");
  const int64_t cols = check_rows(s, padded_rows, lengths, branch_mask);
  Tensor out = at::empty({s.rows, s.dim}, queries.options());
  attend_layer(s, queries.contiguous(), prefix_k, prefix_v, branch_k, branch_v, cols, branch_mask, out.data_ptr<float>());
  return out;
}

TORCH_LIBRARY(kspec, m) {
#define KSPEC_ARGUMENT(name) torch::arg(#name),
#define KSPEC_TYPE(name) LoopModel::Tensors,
  m.class_<LoopModel>("LoopModel")
      .def(torch::init<KSPEC_LAYER_TENSORS(KSPEC_TYPE) int64_t, int64_t, double, std::string, std::string>(), "",
           {KSPEC_LAYER_TENSORS(KSPEC_ARGUMENT) torch::arg("heads"), torch::arg("kv_heads"), torch::arg("eps"), torch::arg("norm"),
            torch::arg("mlp")});
#undef KSPEC_ARGUMENT
#undef KSPEC_TYPE
  m.def(
      "branch_layers(__torch__.torch.classes.kspec.LoopModel model, Tensor x, Tensor cos, Tensor signed_sin, Tensor prefix_k, "
      "Tensor prefix_v, Tensor(a!) branch_k, Tensor(b!) branch_v, Tensor? branch_mask, int[] lengths, int[] padded_rows, int n_new, "
      "int? n_layers) -> Tensor");
  m.def(
      "branch_attention(Tensor queries, Tensor prefix_k, Tensor prefix_v, Tensor branch_k, Tensor branch_v, "
      "Tensor? branch_mask, int[] lengths, int[] padded_rows, int n_new) -> Tensor");
}

TORCH_LIBRARY_IMPL(kspec, CPU, m) {
  m.impl("branch_layers", branch_layers);
  m.impl("branch_attention", branch_attention);
}
