// Linear layer through BLAS GEMM, forward and backward (see kernels/ops.h).
// Weights are (OC, IC) row-major, so the forward is inp · weightᵀ.
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace berth::cpu {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC) {
  T beta = 0;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
      T* o = out + int64_t(n) * OC;
      for (int o_i = 0; o_i < OC; o_i++) o[o_i] = bias[o_i];
    }
    beta = 1;
  }
  gemm(false, true, N, OC, IC, T(1), inp, IC, weight, IC, beta, out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int IC, int OC) {
  if (dinp != nullptr) gemm(false, false, N, IC, OC, T(1), dout, OC, weight, IC, T(0), dinp, IC);
  if (dweight != nullptr) gemm(true, false, OC, IC, N, T(1), dout, OC, inp, IC, T(1), dweight, IC);
  if (dbias != nullptr) {
    constexpr int kChunk = 16;
    const int n_chunks = (OC + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < n_chunks; chunk++) {
      const int o0 = chunk * kChunk, o1 = o0 + kChunk < OC ? o0 + kChunk : OC;
      T acc[kChunk] = {};
      for (int n = 0; n < N; n++) {
        const T* d = dout + int64_t(n) * OC;
        for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
      }
      for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int,
                                    int);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int,
                                     int, int);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int, int, int);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int, int, int);

}  // namespace berth::cpu
