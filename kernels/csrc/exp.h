// e^x for x <= 0, shared by the MLP's activations and the attention's softmax.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace {

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
}  // namespace
