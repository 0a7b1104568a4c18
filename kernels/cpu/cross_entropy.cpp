// Softmax + cross-entropy over the real vocabulary V of Vp padded logits (see kernels/ops.h).
// Padded columns [V, Vp) never take part: they get no probability and zero gradient.
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/ops.h"

namespace berth::cpu {
namespace {

template <typename T>
T row_logsumexp(const T* row, int V) {
  T mx = row[0];
  for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += exp_approx(row[v] - mx);
  return mx + std::log(sum);
}

}  // namespace

template <typename T>
void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V,
                          int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0;
      continue;
    }
    const T* row = logits + int64_t(n) * Vp;
    losses[n] = row_logsumexp(row, V) - row[t];
  }
}

template <typename T>
void crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, T dloss, int N,
                           int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const int32_t t = targets[n];
    const T* row = logits + int64_t(n) * Vp;
    T* drow = dlogits + int64_t(n) * Vp;
    if (t < 0) {
      for (int v = 0; v < Vp; v++) drow[v] = 0;
      continue;
    }
    const T lse = row_logsumexp(row, V);
#pragma omp simd
    for (int v = 0; v < V; v++) drow[v] = dloss * exp_approx(row[v] - lse);  // read before write
    drow[t] -= dloss;
    for (int v = V; v < Vp; v++) drow[v] = 0;
  }
}

template void crossentropy_forward<float>(float*, const float*, const int32_t*, int, int, int);
template void crossentropy_forward<double>(double*, const double*, const int32_t*, int, int, int);
template void crossentropy_backward<float>(float*, const float*, const int32_t*, float, int, int,
                                           int);
template void crossentropy_backward<double>(double*, const double*, const int32_t*, double, int,
                                            int, int);

}  // namespace berth::cpu
