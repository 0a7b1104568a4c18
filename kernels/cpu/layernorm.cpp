// LayerNorm (eps 1e-5), forward and backward (see kernels/ops.h).
#include <cmath>

#include "kernels/ops.h"

namespace berth::cpu {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C) {
  const T eps = T(1e-5);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* x = inp + int64_t(n) * C;
    T m = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    T var = 0;
    for (int c = 0; c < C; c++) {
      const T d = x[c] - m;
      var += d * d;
    }
    var /= C;
    const T s = T(1) / std::sqrt(var + eps);
    T* o = out + int64_t(n) * C;
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// Two passes so neither needs atomics: rows in parallel for dinp, then channels in parallel for the
// parameter gradients (each thread sums its channels over all rows, in row order: deterministic).
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* d = dout + int64_t(n) * C;
    const T* x = inp + int64_t(n) * C;
    const T m = mean[n], s = rstd[n];
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; c++) {
      const T norm = (x[c] - m) * s;
      const T dnorm = weight[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* di = dinp + int64_t(n) * C;
    for (int c = 0; c < C; c++) {
      const T norm = (x[c] - m) * s;
      const T dnorm = weight[c] * d[c];
      di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  constexpr int kChunk = 16;
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < n_chunks; chunk++) {
    const int c0 = chunk * kChunk, c1 = c0 + kChunk < C ? c0 + kChunk : C;
    T dw[kChunk] = {}, db[kChunk] = {};
    for (int n = 0; n < N; n++) {
      const T* d = dout + int64_t(n) * C;
      const T* x = inp + int64_t(n) * C;
      const T m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; c++) {
        dw[c - c0] += (x[c] - m) * s * d[c];
        db[c - c0] += d[c];
      }
    }
    for (int c = c0; c < c1; c++) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const double*, int, int);

}  // namespace berth::cpu
