// The fp32 ops that reduce along a long row, a block per row: layernorm over C channels,
// cross-entropy over the vocabulary (or a tensor-parallel rank's shard of it), and the squared sum
// of a parameter range a block per contiguous part. The block's threads stride over the row (so
// neighbouring threads read neighbouring floats: coalesced) and meet in a tree reduction in shared
// memory, whose order is fixed: the results are deterministic. One thread per row, as these ops
// ran before, kept a GPT-2 step's 16384 rows on 64 blocks, each thread looping over 768 channels
// or 50257 logits alone.
//
// Written over tiles.h's Team, so the same code runs on the host in the tests: played by one
// thread (Team{0, 1}: each loop covers the whole row, the reduction is the loop's sum) or in SIMT
// mode by a host thread per GPU thread with real barriers (tests/test_backend.cpp,
// RowKernelsAreRightWithEveryThreadOfABlockRunning; scripts/race_check runs it under
// ThreadSanitizer).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/thread_bodies.h"
#include "kernels/cuda/tiles.h"

namespace berth::cuda::rows {
inline namespace BERTH_TILES_EXECUTOR {

using tiles::Team;

constexpr int kThreads = 256;  // a block's threads: a power of two, whole warps

struct Sum {
  template <typename T>
  BERTH_DEV T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  BERTH_DEV float operator()(float a, float b) const { return b > a ? b : a; }
};

// `op` over every thread's `mine`, returned to every thread: a tree over `scratch` (team.n
// values, team.n a power of two). Every thread of the block must call it.
template <typename T, class Op>
BERTH_DEV T block_reduce(const Team& team, T* scratch, T mine, Op op) {
  scratch[team.tid] = mine;
  team.sync();
  for (int s = team.n / 2; s > 0; s /= 2) {
    if (team.tid < s) scratch[team.tid] = op(scratch[team.tid], scratch[team.tid + s]);
    team.sync();
  }
  const T r = scratch[0];
  team.sync();  // every thread has read it before the scratch is written again
  return r;
}

// The shared memory of the float kernels: one float per thread.
constexpr size_t kFloatScratch = size_t(kThreads) * sizeof(float);

// max of row[0, n) (−inf when n ≤ 0), on every thread
BERTH_DEV float row_max(const Team& team, float* scratch, const float* row, int n) {
  float m = body::neg_inf();
  for (int v = team.tid; v < n; v += team.n) m = row[v] > m ? row[v] : m;
  return block_reduce(team, scratch, m, Max{});
}
// Σ exp(x − mx) over row[0, n), on every thread
BERTH_DEV float row_sum_exp(const Team& team, float* scratch, const float* row, int n, float mx) {
  float s = 0;
  for (int v = team.tid; v < n; v += team.n) s += expf(row[v] - mx);
  return block_reduce(team, scratch, s, Sum{});
}
// max and Σ exp(x − max) of row[0, n), on every thread (the log-sum-exp is mx + log(sum)).
struct RowExp {
  float mx, sum;
};
BERTH_DEV RowExp row_exp(const Team& team, float* scratch, const float* row, int n) {
  const float mx = row_max(team, scratch, row, n);
  return {mx, row_sum_exp(team, scratch, row, n, mx)};
}

// ---- layernorm (eps 1e-5): block n is row n
// ------------------------------------------------------
struct LayerNormForward {
  float *out, *mean, *rstd;
  const float *inp, *weight, *bias;
  int N, C;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    float* scratch = reinterpret_cast<float*>(smem);
    const float* x = inp + int64_t(n) * C;
    float s = 0;
    for (int c = team.tid; c < C; c += team.n) s += x[c];
    const float m = block_reduce(team, scratch, s, Sum{}) / float(C);
    float v = 0;
    for (int c = team.tid; c < C; c += team.n) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / sqrtf(block_reduce(team, scratch, v, Sum{}) / float(C) + 1e-5f);
    float* o = out + int64_t(n) * C;
    for (int c = team.tid; c < C; c += team.n) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    if (team.tid == 0) mean[n] = m, rstd[n] = r;
  }
};
// dinp (+=) of row n; the parameter gradients are body::layernorm_param_partials' column sums.
struct LayerNormBackward {
  float* dinp;
  const float *dout, *inp, *weight, *mean, *rstd;
  int N, C;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    float* scratch = reinterpret_cast<float*>(smem);
    const float* d = dout + int64_t(n) * C;
    const float* x = inp + int64_t(n) * C;
    const float m = mean[n], s = rstd[n];
    float dm = 0, dnm = 0;
    for (int c = team.tid; c < C; c += team.n) {
      const float dnorm = weight[c] * d[c];
      dm += dnorm;
      dnm += dnorm * (x[c] - m) * s;
    }
    dm = block_reduce(team, scratch, dm, Sum{}) / float(C);
    dnm = block_reduce(team, scratch, dnm, Sum{}) / float(C);
    float* di = dinp + int64_t(n) * C;
    for (int c = team.tid; c < C; c += team.n)
      di[c] += (weight[c] * d[c] - dm - (x[c] - m) * s * dnm) * s;
  }
};

// ---- cross-entropy over the real vocabulary V of rows Vp wide: block n is row n -----------------
struct CrossEntropyForward {
  float* losses;
  const float* logits;
  const int32_t* targets;
  int N, V, Vp;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    const int32_t t = targets[n];
    if (t < 0) {  // the same for the whole block: no thread reaches a barrier
      if (team.tid == 0) losses[n] = 0;
      return;
    }
    const float* row = logits + int64_t(n) * Vp;
    const RowExp e = row_exp(team, reinterpret_cast<float*>(smem), row, V);
    if (team.tid == 0) losses[n] = e.mx + logf(e.sum) - row[t];
  }
};
// dlogits may be logits (in place): each thread reads its elements before it writes them, and the
// reductions end before any thread writes.
struct CrossEntropyBackward {
  float* dlogits;
  const float* logits;
  const int32_t* targets;
  float dloss;
  int N, V, Vp;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    const int32_t t = targets[n];
    const float* row = logits + int64_t(n) * Vp;
    float* drow = dlogits + int64_t(n) * Vp;
    if (t < 0) {
      for (int v = team.tid; v < Vp; v += team.n) drow[v] = 0;
      return;
    }
    const RowExp e = row_exp(team, reinterpret_cast<float*>(smem), row, V);
    const float lse = e.mx + logf(e.sum);
    for (int v = team.tid; v < Vp; v += team.n) {
      const float p = v < V ? dloss * expf(row[v] - lse) : 0.0f;
      drow[v] = v == t && v < V ? p - dloss : p;  // padding columns get 0, as on the CPU
    }
  }
};

// ---- tensor parallelism: a rank's vocabulary shard, `real` columns of rows Vp_local wide --------
struct VocabCeMax {
  float* mx;
  const float* logits_local;
  int N, real, Vp_local;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    const float m =
        row_max(team, reinterpret_cast<float*>(smem), logits_local + int64_t(n) * Vp_local, real);
    if (team.tid == 0) mx[n] = m;
  }
};
// st[2n] = Σ exp(x − mx[n]) over the shard's real columns, st[2n + 1] = the target's logit if the
// shard holds it, else 0.
struct VocabCePartials {
  float* st;
  const float *logits_local, *mx;
  const int32_t* targets;
  int N, real, Vp_local, offset;
  int64_t blocks() const { return N; }
  static constexpr size_t shared_bytes() { return kFloatScratch; }
  BERTH_DEV void run(int n, const Team& team, unsigned char* smem) const {
    const float* row = logits_local + int64_t(n) * Vp_local;
    const float s = row_sum_exp(team, reinterpret_cast<float*>(smem), row, real, mx[n]);
    if (team.tid != 0) return;
    const int32_t t = targets[n];
    st[2 * int64_t(n)] = s;
    st[2 * int64_t(n) + 1] = t >= offset && t < offset + real ? row[t - offset] : 0.0f;
  }
};

// ---- Σ x² in double, block p summing the contiguous part p of `parts` ---------------------------
struct SumSquares {
  double* partial;
  const float* x;
  int64_t n;
  int parts;
  int64_t blocks() const { return parts; }
  static constexpr size_t shared_bytes() { return size_t(kThreads) * sizeof(double); }
  BERTH_DEV void run(int p, const Team& team, unsigned char* smem) const {
    const int64_t begin = n * p / parts, end = n * (p + 1) / parts;
    double acc = 0;
    for (int64_t i = begin + team.tid; i < end; i += team.n) acc += double(x[i]) * double(x[i]);
    acc = block_reduce(team, reinterpret_cast<double*>(smem), acc, Sum{});
    if (team.tid == 0) partial[p] = acc;
  }
};

}  // namespace BERTH_TILES_EXECUTOR
}  // namespace berth::cuda::rows
