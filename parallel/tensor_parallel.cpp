#include "parallel/tensor_parallel.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/fast_math.h"
#include "kernels/ops.h"
#include "runtime/core/check.h"

namespace berth {

void column_linear_forward(float* out, const float* inp, const float* w, const float* b, int N,
                           int IC, int OC_local) {
  cpu::matmul_forward(out, inp, w, b, N, IC, OC_local);
}

void column_linear_backward(Communicator& tp, float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, int N, int IC, int OC_local) {
  cpu::matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC_local);
  if (dinp != nullptr && tp.size() > 1) {
    tp.all_reduce(dinp, dinp, size_t(N) * size_t(IC), DType::F32, ReduceOp::SUM);
  }
}

void row_linear_forward(Communicator& tp, float* out, const float* inp_local, const float* w,
                        const float* b, int N, int IC_local, int OC) {
  cpu::matmul_forward<float>(out, inp_local, w, nullptr, N, IC_local, OC);
  if (tp.size() > 1) tp.all_reduce(out, out, size_t(N) * size_t(OC), DType::F32, ReduceOp::SUM);
  if (b != nullptr) {
    for (int n = 0; n < N; ++n) {
      float* row = out + int64_t(n) * OC;
      for (int o = 0; o < OC; ++o) row[o] += b[o];
    }
  }
}

void row_linear_backward(float* dinp_local, float* dw, float* db, const float* dout,
                         const float* inp_local, const float* w, int N, int IC_local, int OC) {
  cpu::matmul_backward(dinp_local, dw, db, dout, inp_local, w, N, IC_local, OC);
}

void vocab_parallel_cross_entropy_forward(Communicator& tp, float* losses, float* lse,
                                          const float* logits_local, const int32_t* targets, int N,
                                          int V, int Vp_local, int vocab_offset) {
  // Real columns of this rank: global index < V.
  const int real = std::max(0, std::min(Vp_local, V - vocab_offset));
  std::vector<float> mx(size_t(N), -std::numeric_limits<float>::infinity());
  for (int n = 0; n < N; ++n) {
    const float* row = logits_local + int64_t(n) * Vp_local;
    for (int v = 0; v < real; ++v) mx[size_t(n)] = std::max(mx[size_t(n)], row[v]);
  }
  if (tp.size() > 1) tp.all_reduce(mx.data(), mx.data(), size_t(N), DType::F32, ReduceOp::MAX);
  // Σ exp(x − max) and the target logit, reduced together.
  std::vector<float> st(2 * size_t(N), 0.f);
  for (int n = 0; n < N; ++n) {
    const float* row = logits_local + int64_t(n) * Vp_local;
    float s = 0;
    for (int v = 0; v < real; ++v) s += cpu::exp_approx(row[v] - mx[size_t(n)]);
    st[2 * size_t(n)] = s;
    const int32_t t = targets[n];
    if (t >= vocab_offset && t < vocab_offset + real) st[2 * size_t(n) + 1] = row[t - vocab_offset];
  }
  if (tp.size() > 1) tp.all_reduce(st.data(), st.data(), st.size(), DType::F32, ReduceOp::SUM);
  for (int n = 0; n < N; ++n) {
    lse[n] = mx[size_t(n)] + std::log(st[2 * size_t(n)]);
    losses[n] = targets[n] < 0 ? 0.f : lse[n] - st[2 * size_t(n) + 1];
  }
}

void vocab_parallel_cross_entropy_backward(float* dlogits_local, const float* logits_local,
                                           const float* lse, const int32_t* targets, float dloss,
                                           int N, int V, int Vp_local, int vocab_offset) {
  const int real = std::max(0, std::min(Vp_local, V - vocab_offset));
  for (int n = 0; n < N; ++n) {
    const float* row = logits_local + int64_t(n) * Vp_local;
    float* drow = dlogits_local + int64_t(n) * Vp_local;
    const int32_t t = targets[n];
    if (t < 0) {
      for (int v = 0; v < Vp_local; ++v) drow[v] = 0;
      continue;
    }
    for (int v = 0; v < real; ++v) drow[v] = dloss * cpu::exp_approx(row[v] - lse[n]);
    for (int v = real; v < Vp_local; ++v) drow[v] = 0;
    if (t >= vocab_offset && t < vocab_offset + real) drow[t - vocab_offset] -= dloss;
  }
}

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
