// Vocabulary-parallel embedding and cross-entropy pieces, and the bias add after a row-parallel
// reduction (kernels/ops.h): the local work of parallel/tensor_parallel.cpp's primitives.
#include <cmath>
#include <limits>

#include "kernels/cpu/fast_math.h"
#include "kernels/ops.h"

namespace berth::cpu {

template <typename T>
void vocab_embedding_forward(T* out, const int32_t* tokens, const int32_t* positions,
                             const T* wte_local, const T* wpe, int N, int C, int Vp_local,
                             int offset) {
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    T* o = out + int64_t(n) * C;
    const int32_t t = tokens[n] - offset;
    const T* w = t >= 0 && t < Vp_local ? wte_local + int64_t(t) * C : nullptr;
    const T* p = wpe != nullptr ? wpe + int64_t(positions[n]) * C : nullptr;
    for (int c = 0; c < C; ++c) o[c] = (w != nullptr ? w[c] : T(0)) + (p != nullptr ? p[c] : T(0));
  }
}

// Sequential over tokens: two tokens may share a row.
template <typename T>
void vocab_embedding_backward(T* dwte_local, T* dwpe, const T* dout, const int32_t* tokens,
                              const int32_t* positions, int N, int C, int Vp_local, int offset) {
  for (int n = 0; n < N; ++n) {
    const T* d = dout + int64_t(n) * C;
    const int32_t t = tokens[n] - offset;
    if (t >= 0 && t < Vp_local) {
      T* w = dwte_local + int64_t(t) * C;
      for (int c = 0; c < C; ++c) w[c] += d[c];
    }
    if (dwpe != nullptr) {
      T* p = dwpe + int64_t(positions[n]) * C;
      for (int c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

template <typename T>
void vocab_ce_max(T* mx, const T* logits_local, int N, int real, int Vp_local) {
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    T m = -std::numeric_limits<T>::infinity();
    for (int v = 0; v < real; ++v) m = row[v] > m ? row[v] : m;
    mx[n] = m;
  }
}

template <typename T>
void vocab_ce_partials(T* st, const T* logits_local, const T* mx, const int32_t* targets, int N,
                       int real, int Vp_local, int offset) {
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    T s = 0;
    for (int v = 0; v < real; ++v) s += exp_approx(row[v] - mx[n]);
    st[2 * int64_t(n)] = s;
    const int32_t t = targets[n];
    st[2 * int64_t(n) + 1] = t >= offset && t < offset + real ? row[t - offset] : T(0);
  }
}

template <typename T>
void vocab_ce_finish(T* losses, T* lse, const T* mx, const T* st, const int32_t* targets, int N) {
  for (int n = 0; n < N; ++n) {
    lse[n] = mx[n] + std::log(st[2 * int64_t(n)]);
    losses[n] = targets[n] < 0 ? T(0) : lse[n] - st[2 * int64_t(n) + 1];
  }
}

template <typename T>
void vocab_ce_backward(T* dlogits_local, const T* logits_local, const T* lse,
                       const int32_t* targets, T dloss, int N, int real, int Vp_local, int offset) {
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    T* drow = dlogits_local + int64_t(n) * Vp_local;
    const int32_t t = targets[n];
    if (t < 0) {
      for (int v = 0; v < Vp_local; ++v) drow[v] = 0;
      continue;
    }
    for (int v = 0; v < real; ++v) drow[v] = dloss * exp_approx(row[v] - lse[n]);
    for (int v = real; v < Vp_local; ++v) drow[v] = 0;
    if (t >= offset && t < offset + real) drow[t - offset] -= dloss;
  }
}

template <typename T>
void bias_add(T* out, const T* bias, int N, int OC) {
  for (int n = 0; n < N; ++n) {
    T* row = out + int64_t(n) * OC;
    for (int o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

#define BERTH_VOCAB_INSTANTIATE(T)                                                                \
  template void vocab_embedding_forward<T>(T*, const int32_t*, const int32_t*, const T*,         \
                                           const T*, int, int, int, int);                        \
  template void vocab_embedding_backward<T>(T*, T*, const T*, const int32_t*, const int32_t*,    \
                                            int, int, int, int);                                 \
  template void vocab_ce_max<T>(T*, const T*, int, int, int);                                     \
  template void vocab_ce_partials<T>(T*, const T*, const T*, const int32_t*, int, int, int, int); \
  template void vocab_ce_finish<T>(T*, T*, const T*, const T*, const int32_t*, int);              \
  template void vocab_ce_backward<T>(T*, const T*, const T*, const int32_t*, T, int, int, int,    \
                                     int);                                                        \
  template void bias_add<T>(T*, const T*, int, int);
BERTH_VOCAB_INSTANTIATE(float)
BERTH_VOCAB_INSTANTIATE(double)
#undef BERTH_VOCAB_INSTANTIATE

}  // namespace berth::cpu
