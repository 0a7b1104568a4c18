#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/fast_math.h"
#include "kernels/dispatch.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

bool split(const Communicator* tp) { return tp != nullptr && tp->size() > 1; }

template <typename T>
void sum_over(Communicator* tp, T* buf, size_t count) {
  tp->all_reduce(buf, buf, count, dtype_of<T>(), ReduceOp::SUM);
}

template <typename T>
T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return cpu::exp_approx(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace

template <typename T>
void column_linear_forward(Backend* be, T* out, const T* inp, const T* w, const T* b, int N, int IC,
                           int OC_local) {
  Ops<T>(be).matmul_forward(out, inp, w, b, N, IC, OC_local);
}

template <typename T>
void column_linear_backward(Backend* be, Communicator* tp, T* dinp, T* dw, T* db, const T* dout,
                            const T* inp, const T* w, int N, int IC, int OC_local) {
  Ops<T>(be).matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC_local);
  if (dinp != nullptr && split(tp)) sum_over(tp, dinp, size_t(N) * size_t(IC));
}

template <typename T>
void row_linear_forward(Backend* be, Communicator* tp, T* out, const T* inp_local, const T* w,
                        const T* b, int N, int IC_local, int OC) {
  if (!split(tp)) {
    Ops<T>(be).matmul_forward(out, inp_local, w, b, N, IC_local, OC);
    return;
  }
  Ops<T>(be).matmul_forward(out, inp_local, w, nullptr, N, IC_local, OC);
  sum_over(tp, out, size_t(N) * size_t(OC));
  if (b != nullptr) {
    for (int n = 0; n < N; ++n) {
      T* row = out + int64_t(n) * OC;
      for (int o = 0; o < OC; ++o) row[o] += b[o];
    }
  }
}

template <typename T>
void row_linear_backward(Backend* be, T* dinp_local, T* dw, T* db, const T* dout,
                         const T* inp_local, const T* w, int N, int IC_local, int OC) {
  Ops<T>(be).matmul_backward(dinp_local, dw, db, dout, inp_local, w, N, IC_local, OC);
}

template <typename T>
void vocab_parallel_embedding_forward(Backend* be, Communicator* tp, T* out, const int32_t* tokens,
                                      const int32_t* positions, const T* wte_local, const T* wpe,
                                      int N, int C, int Vp_local, int vocab_offset) {
  if (!split(tp)) {
    Ops<T>(be).encoder_forward(out, tokens, positions, wte_local, wpe, N, C);
    return;
  }
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    T* o = out + int64_t(n) * C;
    const int32_t t = tokens[n] - vocab_offset;
    if (t >= 0 && t < Vp_local) {
      std::copy(wte_local + int64_t(t) * C, wte_local + int64_t(t + 1) * C, o);
    } else {
      std::fill(o, o + C, T(0));
    }
  }
  sum_over(tp, out, size_t(N) * size_t(C));
#pragma omp parallel for
  for (int n = 0; n < N; ++n) {
    T* o = out + int64_t(n) * C;
    const T* p = wpe + int64_t(positions[n]) * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

template <typename T>
void vocab_parallel_embedding_backward(Backend* be, Communicator* tp, T* dwte_local, T* dwpe,
                                       const T* dout, const int32_t* tokens,
                                       const int32_t* positions, int N, int C, int Vp_local,
                                       int vocab_offset) {
  if (!split(tp)) {
    Ops<T>(be).encoder_backward(dwte_local, dwpe, dout, tokens, positions, N, C);
    return;
  }
  // Sequential over tokens: two tokens may share a row (the CPU encoder does the same).
  for (int n = 0; n < N; ++n) {
    const T* d = dout + int64_t(n) * C;
    const int32_t t = tokens[n] - vocab_offset;
    if (t >= 0 && t < Vp_local) {
      T* w = dwte_local + int64_t(t) * C;
      for (int c = 0; c < C; ++c) w[c] += d[c];
    }
    T* p = dwpe + int64_t(positions[n]) * C;
    for (int c = 0; c < C; ++c) p[c] += d[c];
  }
}

template <typename T>
void vocab_parallel_cross_entropy_forward(Backend* be, Communicator* tp, T* losses, T* lse,
                                          const T* logits_local, const int32_t* targets, int N,
                                          int V, int Vp_local, int vocab_offset) {
  if (!split(tp)) {
    Ops<T>(be).crossentropy_forward(losses, logits_local, targets, N, V, Vp_local);
    return;
  }
  // Real columns of this rank: global index < V.
  const int real = std::max(0, std::min(Vp_local, V - vocab_offset));
  std::vector<T> mx(size_t(N), -std::numeric_limits<T>::infinity());
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    for (int v = 0; v < real; ++v) mx[size_t(n)] = std::max(mx[size_t(n)], row[v]);
  }
  tp->all_reduce(mx.data(), mx.data(), size_t(N), dtype_of<T>(), ReduceOp::MAX);
  // Σ exp(x − max) and the target logit, reduced together.
  std::vector<T> st(2 * size_t(N), T(0));
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    T s = 0;
    for (int v = 0; v < real; ++v) s += exp_of(row[v] - mx[size_t(n)]);
    st[2 * size_t(n)] = s;
    const int32_t t = targets[n];
    if (t >= vocab_offset && t < vocab_offset + real) st[2 * size_t(n) + 1] = row[t - vocab_offset];
  }
  sum_over(tp, st.data(), st.size());
  for (int n = 0; n < N; ++n) {
    lse[n] = mx[size_t(n)] + std::log(st[2 * size_t(n)]);
    losses[n] = targets[n] < 0 ? T(0) : lse[n] - st[2 * size_t(n) + 1];
  }
}

template <typename T>
void vocab_parallel_cross_entropy_backward(Backend* be, Communicator* tp, T* dlogits_local,
                                           const T* logits_local, const T* lse,
                                           const int32_t* targets, T dloss, int N, int V,
                                           int Vp_local, int vocab_offset) {
  if (!split(tp)) {
    Ops<T>(be).crossentropy_backward(dlogits_local, logits_local, targets, dloss, N, V, Vp_local);
    return;
  }
  const int real = std::max(0, std::min(Vp_local, V - vocab_offset));
  for (int n = 0; n < N; ++n) {
    const T* row = logits_local + int64_t(n) * Vp_local;
    T* drow = dlogits_local + int64_t(n) * Vp_local;
    const int32_t t = targets[n];
    if (t < 0) {
      for (int v = 0; v < Vp_local; ++v) drow[v] = 0;
      continue;
    }
    for (int v = 0; v < real; ++v) drow[v] = dloss * exp_of(row[v] - lse[n]);
    for (int v = real; v < Vp_local; ++v) drow[v] = 0;
    if (t >= vocab_offset && t < vocab_offset + real) drow[t - vocab_offset] -= dloss;
  }
}

#define BERTH_TP_INSTANTIATE(T)                                                                    \
  template void column_linear_forward<T>(Backend*, T*, const T*, const T*, const T*, int, int,     \
                                         int);                                                     \
  template void column_linear_backward<T>(Backend*, Communicator*, T*, T*, T*, const T*, const T*, \
                                          const T*, int, int, int);                                \
  template void row_linear_forward<T>(Backend*, Communicator*, T*, const T*, const T*, const T*,   \
                                      int, int, int);                                              \
  template void row_linear_backward<T>(Backend*, T*, T*, T*, const T*, const T*, const T*, int,    \
                                       int, int);                                                  \
  template void vocab_parallel_embedding_forward<T>(Backend*, Communicator*, T*, const int32_t*,   \
                                                    const int32_t*, const T*, const T*, int, int,  \
                                                    int, int);                                     \
  template void vocab_parallel_embedding_backward<T>(Backend*, Communicator*, T*, T*, const T*,    \
                                                     const int32_t*, const int32_t*, int, int,     \
                                                     int, int);                                    \
  template void vocab_parallel_cross_entropy_forward<T>(Backend*, Communicator*, T*, T*, const T*, \
                                                        const int32_t*, int, int, int, int);       \
  template void vocab_parallel_cross_entropy_backward<T>(                                          \
      Backend*, Communicator*, T*, const T*, const T*, const int32_t*, T, int, int, int, int);
BERTH_TP_INSTANTIATE(float)
BERTH_TP_INSTANTIATE(double)
#undef BERTH_TP_INSTANTIATE

std::vector<float> shard_rows(const float* full, int rows, int cols, int tp, int rank) {
  BERTH_CHECK(tp >= 1 && rows % tp == 0 && rank >= 0 && rank < tp,
              "cannot split {} rows over tp = {}: the dimension must be divisible by tp", rows, tp);
  const int64_t n = int64_t(rows / tp) * cols;
  return std::vector<float>(full + rank * n, full + (rank + 1) * n);
}

std::vector<float> shard_cols(const float* full, int rows, int cols, int tp, int rank) {
  BERTH_CHECK(tp >= 1 && cols % tp == 0 && rank >= 0 && rank < tp,
              "cannot split {} columns over tp = {}: the dimension must be divisible by tp", cols,
              tp);
  const int local = cols / tp;
  std::vector<float> out(size_t(rows) * size_t(local));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < local; ++c) {
      out[size_t(r) * size_t(local) + size_t(c)] = full[int64_t(r) * cols + rank * local + c];
    }
  }
  return out;
}

}  // namespace berth
