// exp and tanh for the float CPU kernels, written so that GCC vectorizes the loops calling them
// (`#pragma omp simd`; the kernels build with -fno-trapping-math so the clamps if-convert):
// libm's scalar expf/tanhf took ~40 % of a GELU-heavy step.
// Accuracy (tests/test_fast_math.cpp): exp within 2 ulp of libm over [-87, 88] (measured 0.97;
// Cephes expf range reduction and polynomial); tanh from exp, absolute error < 2.5e-7 (measured
// 1.8e-7). The double overloads call libm: they serve the fp64 gradient tests.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace berth::cpu {

inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // n = round(x / ln 2) by the 1.5·2^23 trick (no floor call: GCC vectorizes this, not floorf)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;                                // ln 2 split in two parts
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(bits);
}

inline float tanh_approx(float x) { return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f); }

inline double exp_approx(double x) { return std::exp(x); }
inline double tanh_approx(double x) { return std::tanh(x); }

}  // namespace berth::cpu
