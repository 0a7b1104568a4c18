// Token + position embedding, forward and backward (see kernels/ops.h).
#include <algorithm>

#include "kernels/ops.h"

namespace berth::cpu {

// ---- kernels ------------------------------------------------------------------------------------
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                     const T* wpe, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* te = wte + int64_t(tokens[n]) * C;
    const T* pe = wpe + int64_t(positions[n]) * C;
    T* o = out + int64_t(n) * C;
    for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
  }
}

// Scatter-add: tokens repeat, so threads split the channels (each owns columns [c0, c1) of every
// row) instead of the tokens, which keeps the accumulation race-free and deterministic.
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                      const int32_t* positions, int N, int C) {
  constexpr int kChunk = 32;
  const int n_chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < n_chunks; chunk++) {
    const int c0 = chunk * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int n = 0; n < N; n++) {
      const T* d = dout + int64_t(n) * C;
      T* te = dwte + int64_t(tokens[n]) * C;
      T* pe = dwpe + int64_t(positions[n]) * C;
      for (int c = c0; c < c1; c++) {
        te[c] += d[c];
        pe[c] += d[c];
      }
    }
  }
}

template void encoder_forward<float>(float*, const int32_t*, const int32_t*, const float*,
                                     const float*, int, int);
template void encoder_forward<double>(double*, const int32_t*, const int32_t*, const double*,
                                      const double*, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int32_t*,
                                      const int32_t*, int, int);
template void encoder_backward<double>(double*, double*, const double*, const int32_t*,
                                       const int32_t*, int, int);

}  // namespace berth::cpu
