// AdamW update and the squared norm used for global gradient clipping (see kernels/ops.h).
#include <omp.h>

#include <cmath>

#include "kernels/ops.h"

namespace berth::cpu {

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  const double bc1 = 1.0 - std::pow(double(beta1), double(t));
  const double bc2 = 1.0 - std::pow(double(beta2), double(t));
  const T b1 = T(beta1), b2 = T(beta2), e = T(eps), wd = T(weight_decay), a = T(lr);
  const T inv_bc1 = T(1.0 / bc1), inv_bc2 = T(1.0 / bc2), gs = T(grad_scale);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const T g = grads[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * g;
    const T vi = b2 * v[i] + (T(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const T m_hat = mi * inv_bc1;
    const T v_hat = vi * inv_bc2;
    params[i] -= a * (m_hat / (std::sqrt(v_hat) + e) + wd * params[i]);
  }
}

// Each thread sums a fixed contiguous range; the partial sums are added in thread order, so the
// result is deterministic for a fixed thread count (an OpenMP reduction clause is not).
template <typename T>
double sum_squares(const T* x, int64_t n) {
  constexpr int kMaxThreads = 256;
  double partial[kMaxThreads] = {};
  int n_threads = 1;
#pragma omp parallel
  {
    const int nt = omp_get_num_threads() < kMaxThreads ? omp_get_num_threads() : kMaxThreads;
    const int tid = omp_get_thread_num();
#pragma omp single
    n_threads = nt;
    if (tid < nt) {
      const int64_t begin = n * tid / nt, end = n * (tid + 1) / nt;
      double acc = 0;
      for (int64_t i = begin; i < end; i++) acc += double(x[i]) * double(x[i]);
      partial[tid] = acc;
    }
  }
  double total = 0;
  for (int i = 0; i < n_threads; i++) total += partial[i];
  return total;
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, float, float,
                                  float, float, float, float, int64_t);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, float,
                                   float, float, float, float, float, int64_t);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace berth::cpu
