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
// step). On an AVX-512 or AVX2 build with heads of 64 or 128 it is written out here (`attend_direct`,
// `attend_lanes`: one softmax over a query's prefix and branch scores, nothing to merge);
// elsewhere two calls of PyTorch's CPU flash kernel and a log-sum-exp merge, as
// kernels/cpu_fused.py. Why written out, with the measurements on Zen 4 and Zen 3:
// docs/measurements/kernels-log.md.
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
#include "attention/avx2.h"
#include "simd.h"

at::Tensor q4_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp
at::Tensor q8_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp
at::Tensor q5_q8_matmul(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& params);  // q4_q8_matmul.cpp

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

// A float16 of the prompt's KV (the prefix, stored in 16 bits: a step reads half the bytes; the
// branches' own few entries stay float32). A struct, not its bits' integer type: bf16 is that.
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(f16) == 2);
const f16* f16_data(const Tensor& t) { return reinterpret_cast<const f16*>(t.data_ptr<c10::Half>()); }

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
#if defined(__AVX512F__)
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d))));
#elif defined(__F16C__)
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
#else
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(c10::Half(row[d], c10::Half::from_bits()));
#endif
  }
  out_stride = D;
  return scratch;
}

// e^x for x <= 0 (SiLU's e^-|x|): Cephes' polynomial, ~2 ulp, written so the compiler
// vectorizes it (std::exp in a loop stays scalar). Below e^-60 it is 0: 1 + e^x is then 1 in
// float32, and the product would be a denormal number, which costs x86 ~100 cycles.
inline float exp_nonpositive(float x) {
  const bool negligible = x < -60.0f;
  x = std::max(x, -60.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // rounded (1.5 * 2^23: floor() stays scalar)
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);  // 2^n
  return negligible ? 0.0f : y * scale;
}

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
// norm_to, add_biased_to and mlp_hidden are noinline: inlined into the layer loop, they changed
// how GCC compiled the q|k|v loop beside them, and with it the order of Qwen3's q/k norm sums on
// an AVX2 build (one ulp, which the 8-bit activations carried to 6 % of a test's scale); out of
// line, llama/qwen2/qwen3 compute bit for bit what they did before StarCoder2 (AVX-512 and AVX2
// builds). One call per layer and row block: nothing to measure.
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

// Row r's place among a step's k T padded rows (branch p / T, new token p % T): padded_rows[r]
// where a step computes only some of them (check_rows), else r itself
inline int64_t padded_row(const int64_t* padded_rows, int64_t r) { return padded_rows ? padded_rows[r] : r; }

struct Dims {
  int64_t rows, dim, heads, kv_heads, head_dim, n_new, branches, capacity;
  const int64_t* padded_rows = nullptr;  // [R] the rows computed of the k T padded ones; nullptr: all
  int64_t padded(int64_t r) const { return padded_row(padded_rows, r); }
};

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

#if KSPEC_LANES_ATTENTION
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
#endif

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
// its forms' codes are [N/16, K/32, R, 16, 4] with R = 4, 5 or 8 registers for 4-, 5- and 8-bit
// codes, so a layer may mix them: a Q4_K_M file's Q6_K v and down projections beside Q4_K ones)
Tensor matmul(const Tensor& x, const Tensor& packed, const Tensor& scales) {
  if (x.scalar_type() == at::kFloat) {
    const int64_t registers = packed.dim() == 5 ? packed.size(2) : 4;
    if (registers == 8) return q8_q8_matmul(x, packed, scales);
    return registers == 5 ? q5_q8_matmul(x, packed, scales) : q4_q8_matmul(x, packed, scales);
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

}  // namespace

// x [R, dim] float32 (R = k * T rows, row r: branch r / T, new token r % T; or the rows at
// padded_rows of those, see check_rows); cos, signed sin [R, D] float32 (engine/models/rope.py:
// rotate_half folded into a roll and a signed sin).
// Per layer l: input and post-attention norm weights [dim] (and biases [dim]: norm "layer",
// LayerNorm; none: "rms"); the int4 kernel's packed weights and scales/zeros of q|k|v, o, the
// MLP's first matmul (mlp "silu_gated": gate|up [2 I]; "gelu_tanh": c_fc [I]) and down (c_proj);
// the q|k|v bias [(H + 2 Hkv) D] or none; the per-head RMSNorm weights of q and of k [D] (Qwen3's
// q_norm / k_norm, before rotary) or none; the biases of o [dim], of the first MLP matmul [I]
// (gelu_tanh only) and of down [dim], each one per layer or none.
// prefix_k/v [L, 1, Hkv, P, D] float32 or float16 (unit last stride), branch_k/v [L, k, Hkv, S, D]
// float32 contiguous, written at slots lengths[b] + t; branch_mask the branch piece's additive mask [k, 1, T, cols]
// (kernels/contract.py BranchLayout: the masking rules are written once, there) or none.
// Returns the residual stream after the last layer [R, dim].
Tensor branch_layers(const Tensor& x_in, const Tensor& cos, const Tensor& signed_sin, at::TensorList input_norm,
                     at::TensorList input_norm_bias, at::TensorList qkv_packed, at::TensorList qkv_scales, at::TensorList qkv_bias,
                     at::TensorList q_norm, at::TensorList k_norm, at::TensorList o_packed, at::TensorList o_scales, at::TensorList o_bias,
                     at::TensorList post_norm, at::TensorList post_norm_bias, at::TensorList gate_up_packed,
                     at::TensorList gate_up_scales, at::TensorList gate_up_bias, at::TensorList down_packed,
                     at::TensorList down_scales, at::TensorList down_bias, const Tensor& prefix_k, const Tensor& prefix_v, const Tensor& branch_k,
                     const Tensor& branch_v, const std::optional<Tensor>& branch_mask, at::IntArrayRef lengths,
                     at::IntArrayRef padded_rows, int64_t n_new, int64_t heads, int64_t kv_heads, double eps,
                     const std::string& norm, const std::string& mlp) {
  const int64_t layers = input_norm.size();
  const NormKind norm_type = norm_kind(norm);
  const MlpKind mlp_type = mlp_kind(mlp);
  check(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "x must be [R, dim] float32");
  check(branch_k.dim() == 5 && branch_k.is_contiguous() && branch_v.is_contiguous(), "branch buffers must be contiguous [L, k, Hkv, S, D]");
  check(branch_k.scalar_type() == at::kFloat && branch_v.scalar_type() == at::kFloat, "the branch buffers must be float32");
  check_prefix_type(prefix_k, prefix_v);
  check(prefix_k.dim() == 5 && prefix_k.stride(4) == 1 && prefix_v.strides() == prefix_k.strides(), "prefix KV must be [L, 1, Hkv, P, D] with unit last stride");
  check(branch_k.size(0) >= layers && prefix_k.size(0) >= layers, "fewer cache layers than weights");
  check(qkv_bias.empty() || static_cast<int64_t>(qkv_bias.size()) == layers, "one q|k|v bias per layer or none");
  check(q_norm.size() == k_norm.size() && (q_norm.empty() || static_cast<int64_t>(q_norm.size()) == layers),
        "one q norm and one k norm per layer or none");
  for (const Tensor& w : q_norm) check(w.scalar_type() == at::kFloat && w.numel() == branch_k.size(4), "q norm weights must be [D] float32");
  for (const Tensor& w : k_norm) check(w.scalar_type() == at::kFloat && w.numel() == branch_k.size(4), "k norm weights must be [D] float32");
  const bool layer_norm = norm_type == NormKind::layer;
  check(static_cast<int64_t>(input_norm_bias.size()) == (layer_norm ? layers : 0) && post_norm_bias.size() == input_norm_bias.size(),
        "norm biases: one per layer for LayerNorm, none for RMSNorm");
  for (at::TensorList biases : {input_norm_bias, post_norm_bias, o_bias, down_bias})
    for (const Tensor& b : biases)
      check(b.scalar_type() == at::kFloat && b.numel() == x_in.size(1) && b.is_contiguous(), "norm, o and down biases must be [dim] float32");
  for (at::TensorList biases : {o_bias, down_bias}) check(biases.empty() || static_cast<int64_t>(biases.size()) == layers, "one o / down bias per layer or none");
  check(static_cast<int64_t>(gate_up_bias.size()) == (mlp_type == MlpKind::gelu_tanh ? layers : 0),
        "the first MLP matmul's bias: one per layer for gelu_tanh (c_fc), none for silu_gated");
  for (const Tensor& b : gate_up_bias) check(b.scalar_type() == at::kFloat && b.dim() == 1 && b.is_contiguous(), "c_fc biases must be [I] float32");
  check(layers > 0, "no layers");
  Dims s{};
  s.rows = x_in.size(0);
  s.dim = x_in.size(1);
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = branch_k.size(4);
  s.n_new = n_new;
  s.branches = static_cast<int64_t>(lengths.size());
  s.capacity = branch_k.size(3);
  check(heads % kv_heads == 0 && s.head_dim % 2 == 0, "heads or head size do not fit");
  check(s.head_dim <= kMaxHeadDim, "head size above 512");
  check(cos.sizes() == signed_sin.sizes() && cos.size(0) == s.rows && cos.size(1) == s.head_dim, "cos/sin must be [R, D]");
  const int64_t cols = check_rows(s, padded_rows, lengths, branch_mask);  // branch keys any query sees
  const int64_t D = s.head_dim, half = D / 2, qkv_width = (heads + 2 * kv_heads) * D;

  // The weights' kernel decides the matmuls' activations: float16 params are kspec's 4-bit x
  // 8-bit kernel (float32 in and out), bfloat16 scales PyTorch's int4 one (bfloat16).
  const bool float_matmul = qkv_scales[0].scalar_type() == at::kHalf;
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
      norm_to(norm_type, xp, input_norm[l].data_ptr<float>(), layer_norm ? input_norm_bias[l].data_ptr<float>() : nullptr,
              act_data<Act>(normed), s.rows, s.dim, static_cast<float>(eps));
      Tensor qkv = matmul(normed, qkv_packed[l], qkv_scales[l]);  // [R, (H + 2 Hkv) D]
      const Act* proj = act_data<Act>(qkv);
      const float* bias = qkv_bias.empty() ? nullptr : qkv_bias[l].data_ptr<float>();
      const float* qn = q_norm.empty() ? nullptr : q_norm[l].data_ptr<float>();
      const float* kn = k_norm.empty() ? nullptr : k_norm[l].data_ptr<float>();
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
          if (qn != nullptr && h < heads + kv_heads) head_rms_norm(value, h < heads ? qn : kn, D, static_cast<float>(eps));
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
      add_biased_to(xp, act_data<Act>(matmul(attn, o_packed[l], o_scales[l])), o_bias.empty() ? nullptr : o_bias[l].data_ptr<float>(),
                    s.rows, s.dim);
      norm_to(norm_type, xp, post_norm[l].data_ptr<float>(), layer_norm ? post_norm_bias[l].data_ptr<float>() : nullptr,
              act_data<Act>(normed), s.rows, s.dim, static_cast<float>(eps));
      Tensor first = matmul(normed, gate_up_packed[l], gate_up_scales[l]);  // [R, 2 I] gate | up, or [R, I] c_fc
      const float* first_bias = gate_up_bias.empty() ? nullptr : gate_up_bias[l].data_ptr<float>();
      check(first_bias == nullptr || gate_up_bias[l].numel() == first.size(1), "a c_fc bias must be [I]");
      Tensor hidden = mlp_hidden<Act>(mlp_type, first, first_bias);  // [R, I]
      add_biased_to(xp, act_data<Act>(matmul(hidden, down_packed[l], down_scales[l])), down_bias.empty() ? nullptr : down_bias[l].data_ptr<float>(),
                    s.rows, s.dim);
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
  m.def(
      "branch_layers(Tensor x, Tensor cos, Tensor signed_sin, Tensor[] input_norm, Tensor[] input_norm_bias, Tensor[] qkv_packed, "
      "Tensor[] qkv_scales, Tensor[] qkv_bias, Tensor[] q_norm, Tensor[] k_norm, Tensor[] o_packed, Tensor[] o_scales, Tensor[] o_bias, "
      "Tensor[] post_norm, Tensor[] post_norm_bias, Tensor[] gate_up_packed, Tensor[] gate_up_scales, Tensor[] gate_up_bias, "
      "Tensor[] down_packed, Tensor[] down_scales, Tensor[] down_bias, "
      "Tensor prefix_k, Tensor prefix_v, Tensor(a!) branch_k, Tensor(b!) branch_v, Tensor? branch_mask, int[] lengths, "
      "int[] padded_rows, int n_new, "
      "int heads, int kv_heads, float eps, str norm, str mlp) -> Tensor");
  m.def(
      "branch_attention(Tensor queries, Tensor prefix_k, Tensor prefix_v, Tensor branch_k, Tensor branch_v, "
      "Tensor? branch_mask, int[] lengths, int[] padded_rows, int n_new) -> Tensor");
}

TORCH_LIBRARY_IMPL(kspec, CPU, m) {
  m.impl("branch_layers", branch_layers);
  m.impl("branch_attention", branch_attention);
}
