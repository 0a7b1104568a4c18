// Element-wise ops: GELU (tanh approximation) and residual add (see kernels/ops.h).
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/ops.h"

namespace berth::cpu {

// ---- GELU ---------------------------------------------------------------------------------------
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  const T k = T(0.7978845608028654);  // sqrt(2/pi)
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + tanh_approx(k * (x + T(0.044715) * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T k = T(0.7978845608028654);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const T x = inp[i];
    const T u = k * (x + T(0.044715) * x * x * x);
    const T th = tanh_approx(u);
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * k * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] = grad * dout[i];
  }
}

// ---- residual -----------------------------------------------------------------------------------
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);
template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);

}  // namespace berth::cpu
