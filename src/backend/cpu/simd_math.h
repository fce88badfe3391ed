#pragma once
// Vectorisable exp and tanh for the CPU kernels: glibc's expf/tanhf are scalar calls that
// block vectorisation of the softmax, cross-entropy and GELU loops. Cephes-style expf:
// range reduction by ln 2, degree-6 polynomial, scale by 2^n through the exponent bits;
// relative error ~2 ulp over the clamped range.
#include <bit>
#include <cmath>
#include <cstdint>

namespace jumbo::cpu {


[[gnu::always_inline]] inline float fast_expf(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // ternaries vectorise; fmin/fmax may not
  // Round to nearest by the 1.5 x 2^23 trick: std::floor blocks GCC's loop vectoriser.
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

// tanh through exp; the absolute error (~1e-7) is what GELU's 1 + tanh needs.

[[gnu::always_inline]] inline float fast_tanhf(float x) {
  const float c = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);
  return 1.0f - 2.0f / (fast_expf(2.0f * c) + 1.0f);
}

}  // namespace jumbo::cpu
