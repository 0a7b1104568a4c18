#include "parallel/tensor_parallel.h"

#include <algorithm>

#include "kernels/dispatch.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

bool split(const Communicator* tp) { return tp != nullptr && tp->size() > 1; }

template <typename T>
void sum_over(Communicator* tp, T* buf, size_t count) {
  tp->all_reduce(buf, buf, count, dtype_of<T>(), ReduceOp::SUM);
}

// This rank's vocabulary columns that are real (global index < V), from the first.
int real_columns(int V, int Vp_local, int vocab_offset) {
  return std::max(0, std::min(Vp_local, V - vocab_offset));
}

}  // namespace

template <typename T>
void column_linear_forward(Backend* be, T* out, const T* inp, const T* w, const T* b, int N, int IC,
                           int OC_local) {
  Ops<T>(be).matmul_forward(out, inp, w, b, N, IC, OC_local);
}

template <typename T>
void column_linear_gelu_forward(Backend* be, T* out, T* pre, const T* inp, const T* w, const T* b,
                                int N, int IC, int OC_local) {
  Ops<T>(be).matmul_gelu_forward(out, pre, inp, w, b, N, IC, OC_local);
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
  const Ops<T> ops(be);
  if (!split(tp)) {
    ops.matmul_forward(out, inp_local, w, b, N, IC_local, OC);
    return;
  }
  ops.matmul_forward(out, inp_local, w, nullptr, N, IC_local, OC);
  sum_over(tp, out, size_t(N) * size_t(OC));
  if (b != nullptr) ops.bias_add(out, b, N, OC);
}

template <typename T>
void row_linear_backward(Backend* be, T* dinp_local, T* dw, T* db, const T* dout,
                         const T* inp_local, const T* w, int N, int IC_local, int OC) {
  Ops<T>(be).matmul_backward(dinp_local, dw, db, dout, inp_local, w, N, IC_local, OC);
}

template <typename T>
void row_linear_gelu_backward(Backend* be, T* dpre_local, T* dw, T* db, const T* dout,
                              const T* inp_local, const T* w, const T* pre_local, int N,
                              int IC_local, int OC) {
  Ops<T>(be).gelu_matmul_backward(dpre_local, dw, db, dout, inp_local, w, pre_local, N, IC_local,
                                  OC);
}

// Each rank looks up the tokens it holds (0 for the others) and tp rank 0 adds the position
// embedding; the sum over tp is wte + wpe exactly (one nonzero wte row, one wpe row, zeros).
template <typename T>
void vocab_parallel_embedding_forward(Backend* be, Communicator* tp, T* out, const int32_t* tokens,
                                      const int32_t* positions, const T* wte_local, const T* wpe,
                                      int N, int C, int Vp_local, int vocab_offset) {
  const Ops<T> ops(be);
  if (!split(tp)) {
    ops.encoder_forward(out, tokens, positions, wte_local, wpe, N, C);
    return;
  }
  ops.vocab_embedding_forward(out, tokens, positions, wte_local, tp->rank() == 0 ? wpe : nullptr,
                              N, C, Vp_local, vocab_offset);
  sum_over(tp, out, size_t(N) * size_t(C));
}

template <typename T>
void vocab_parallel_embedding_backward(Backend* be, Communicator* tp, T* dwte_local, T* dwpe,
                                       const T* dout, const int32_t* tokens,
                                       const int32_t* positions, int N, int C, int Vp_local,
                                       int vocab_offset) {
  const Ops<T> ops(be);
  if (!split(tp)) {
    ops.encoder_backward(dwte_local, dwpe, dout, tokens, positions, N, C);
    return;
  }
  ops.vocab_embedding_backward(dwte_local, dwpe, dout, tokens, positions, N, C, Vp_local,
                               vocab_offset);
}

// The max, Σexp and target logit are reduced over tp; the full logits are never gathered.
template <typename T>
void vocab_parallel_cross_entropy_forward(Backend* be, Communicator* tp, T* losses, T* lse,
                                          const T* logits_local, const int32_t* targets, int N,
                                          int V, int Vp_local, int vocab_offset) {
  const Ops<T> ops(be);
  if (!split(tp)) {
    ops.crossentropy_forward(losses, logits_local, targets, N, V, Vp_local);
    return;
  }
  const int real = real_columns(V, Vp_local, vocab_offset);
  DeviceBuffer<T> mx(ops.memory(), N), st(ops.memory(), 2 * int64_t(N));
  ops.vocab_ce_max(mx.data(), logits_local, N, real, Vp_local);
  tp->all_reduce(mx.data(), mx.data(), size_t(N), dtype_of<T>(), ReduceOp::MAX);
  ops.vocab_ce_partials(st.data(), logits_local, mx.data(), targets, N, real, Vp_local,
                        vocab_offset);
  sum_over(tp, st.data(), size_t(st.size()));
  ops.vocab_ce_finish(losses, lse, mx.data(), st.data(), targets, N);
}

template <typename T>
void vocab_parallel_cross_entropy_backward(Backend* be, Communicator* tp, T* dlogits_local,
                                           const T* logits_local, const T* lse,
                                           const int32_t* targets, T dloss, int N, int V,
                                           int Vp_local, int vocab_offset) {
  const Ops<T> ops(be);
  if (!split(tp)) {
    ops.crossentropy_backward(dlogits_local, logits_local, targets, dloss, N, V, Vp_local);
    return;
  }
  const int real = real_columns(V, Vp_local, vocab_offset);
  ops.vocab_ce_backward(dlogits_local, logits_local, lse, targets, dloss, N, real, Vp_local,
                        vocab_offset);
}

#define BERTH_TP_INSTANTIATE(T)                                                                    \
  template void column_linear_forward<T>(Backend*, T*, const T*, const T*, const T*, int, int,     \
                                         int);                                                     \
  template void column_linear_gelu_forward<T>(Backend*, T*, T*, const T*, const T*, const T*, int, \
                                              int, int);                                           \
  template void column_linear_backward<T>(Backend*, Communicator*, T*, T*, T*, const T*, const T*, \
                                          const T*, int, int, int);                                \
  template void row_linear_forward<T>(Backend*, Communicator*, T*, const T*, const T*, const T*,   \
                                      int, int, int);                                              \
  template void row_linear_backward<T>(Backend*, T*, T*, T*, const T*, const T*, const T*, int,    \
                                       int, int);                                                  \
  template void row_linear_gelu_backward<T>(Backend*, T*, T*, T*, const T*, const T*, const T*,    \
                                            const T*, int, int, int);                              \
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
