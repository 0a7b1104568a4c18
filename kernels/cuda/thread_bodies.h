// What one CUDA thread of the fp32 kernels does, as plain functions of its work-item index.
//
// The CUDA kernels (kernels/cuda/*.cu) are launched with one thread per work item and call these
// bodies; written without CUDA types or intrinsics, the same bodies compile as host C++, so
// tests/test_backend.cpp runs every work item on the CPU (tests/host_items_backend.h) and checks
// the indexing and the arithmetic against the CPU reference (kernels/ops.h) on any machine, GPU or
// not. Shared outputs of the embedding and materialized-attention backward are accumulated with
// atomic_add (atomicAdd on the device, += on the host); the flash-style attention backward has
// none.
//
// These are the fp32 kernels: one thread per element, per (row part, column) or per (query, head),
// and the ones the fp32 mode compares with the CPU reference. The ops that reduce along a long row
// (layernorm, cross-entropy, the squared sum) are a block per row in row_bodies.h; in bf16
// precision the varlen attention and ring attention's block kernels run the tiled tensor-core
// kernels of flash_bodies.h instead.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define BERTH_HD __host__ __device__ inline
#else
#define BERTH_HD inline
#endif

// Unrolls the next loop on the device (a loop over a compile-time head size keeps an array it
// indexes in registers, not in local memory); nothing on the host.
#if defined(__CUDA_ARCH__)
#define BERTH_UNROLL _Pragma("unroll")
#else
#define BERTH_UNROLL
#endif

namespace berth::cuda::body {

constexpr int kMaxHeadSize = 256;  // attention bodies keep one head's accumulator per thread

BERTH_HD float neg_inf() { return -INFINITY; }

BERTH_HD void atomic_add(float* p, float v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

// ---- embeddings: item i over N·C --------------------------------------------------------------
BERTH_HD void encoder_forward(int64_t i, float* out, const int32_t* tokens,
                              const int32_t* positions, const float* wte, const float* wpe, int C) {
  const int64_t n = i / C, c = i % C;
  out[i] = wte[int64_t(tokens[n]) * C + c] + wpe[int64_t(positions[n]) * C + c];
}
BERTH_HD void encoder_backward(int64_t i, float* dwte, float* dwpe, const float* dout,
                               const int32_t* tokens, const int32_t* positions, int C) {
  const int64_t n = i / C, c = i % C;
  atomic_add(dwte + int64_t(tokens[n]) * C + c, dout[i]);
  atomic_add(dwpe + int64_t(positions[n]) * C + c, dout[i]);
}

// ---- sums over rows, in two stages (layernorm's parameter gradients, a GEMM's bias gradient) --
// Part k of column_parts(N) sums rows [k·kRowsPerPart, (k+1)·kRowsPerPart) of column c (item
// k·C + c: neighbouring threads read neighbouring columns), then add_column_parts adds column c's
// parts in order: spread over N/64 × C threads instead of C, and deterministic (no atomics).
constexpr int kRowsPerPart = 64;
BERTH_HD int column_parts(int N) { return (N + kRowsPerPart - 1) / kRowsPerPart; }
// the end of part k's rows
BERTH_HD int part_end(int k, int N) {
  return (k + 1) * kRowsPerPart < N ? (k + 1) * kRowsPerPart : N;
}
BERTH_HD void layernorm_param_partials(int64_t i, float* part_dw, float* part_db, const float* dout,
                                       const float* inp, const float* mean, const float* rstd,
                                       int N, int C) {
  const int k = int(i / C), c = int(i % C);
  const int end = part_end(k, N);
  float dw = 0, db = 0;
  for (int n = k * kRowsPerPart; n < end; n++) {
    const float d = dout[int64_t(n) * C + c];
    dw += (inp[int64_t(n) * C + c] - mean[n]) * rstd[n] * d;
    db += d;
  }
  part_dw[i] = dw;
  part_db[i] = db;
}
BERTH_HD void bias_grad_partial(int64_t i, float* part, const float* dout, int N, int OC) {
  const int k = int(i / OC), o = int(i % OC);
  const int end = part_end(k, N);
  float acc = 0;
  for (int n = k * kRowsPerPart; n < end; n++) acc += dout[int64_t(n) * OC + o];
  part[i] = acc;
}
// out[c] += Σ_k part[k·C + c], k in order
BERTH_HD void add_column_parts(int c, float* out, const float* part, int parts, int C) {
  float acc = 0;
  for (int k = 0; k < parts; k++) acc += part[int64_t(k) * C + c];
  out[c] += acc;
}

// ---- matmul bias: item i over N·OC
// ---------------------------------------------------------------
BERTH_HD void add_bias(int64_t i, float* out, const float* bias, int OC) { out[i] += bias[i % OC]; }

// ---- element-wise: item i -----------------------------------------------------------------------
BERTH_HD void gelu_forward(int64_t i, float* out, const float* inp) {
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
BERTH_HD void gelu_backward(int64_t i, float* dinp, const float* inp, const float* dout) {
  const float x = inp[i], k = 0.7978845608028654f;
  const float th = tanhf(k * (x + 0.044715f * x * x * x));
  const float grad =
      0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = grad * dout[i];
}
BERTH_HD void residual_forward(int64_t i, float* out, const float* a, const float* b) {
  out[i] = a[i] + b[i];
}

// ---- tensor parallelism: vocabulary shards --------------------------------------------------------
// item i over N·C
BERTH_HD void vocab_embedding_forward(int64_t i, float* out, const int32_t* tokens,
                                      const int32_t* positions, const float* wte_local,
                                      const float* wpe, int C, int Vp_local, int offset) {
  const int64_t n = i / C, c = i % C;
  const int32_t t = tokens[n] - offset;
  const float w = t >= 0 && t < Vp_local ? wte_local[int64_t(t) * C + c] : 0.0f;
  out[i] = w + (wpe != nullptr ? wpe[int64_t(positions[n]) * C + c] : 0.0f);
}
BERTH_HD void vocab_embedding_backward(int64_t i, float* dwte_local, float* dwpe,
                                       const float* dout, const int32_t* tokens,
                                       const int32_t* positions, int C, int Vp_local,
                                       int offset) {
  const int64_t n = i / C, c = i % C;
  const int32_t t = tokens[n] - offset;
  if (t >= 0 && t < Vp_local) atomic_add(dwte_local + int64_t(t) * C + c, dout[i]);
  if (dwpe != nullptr) atomic_add(dwpe + int64_t(positions[n]) * C + c, dout[i]);
}
// row n (the max and partial sums are row_bodies.h's block reductions)
BERTH_HD void vocab_ce_finish(int n, float* losses, float* lse, const float* mx, const float* st,
                              const int32_t* targets) {
  lse[n] = mx[n] + logf(st[2 * int64_t(n)]);
  losses[n] = targets[n] < 0 ? 0.0f : lse[n] - st[2 * int64_t(n) + 1];
}
// item i over N·Vp_local; in place if dlogits_local is logits_local (read, then write)
BERTH_HD void vocab_ce_backward(int64_t i, float* dlogits_local, const float* logits_local,
                                const float* lse, const int32_t* targets, float dloss, int real,
                                int Vp_local, int offset) {
  const int64_t n = i / Vp_local;
  const int v = int(i % Vp_local);
  const int32_t t = targets[n];
  if (t < 0 || v >= real) {
    dlogits_local[i] = 0;
    return;
  }
  const float p = dloss * expf(logits_local[i] - lse[n]);
  dlogits_local[i] = t - offset == v ? p - dloss : p;
}

// ---- AdamW: item i (inv_bc1, inv_bc2 = 1 / bias corrections, computed once on the host) ---------
BERTH_HD void adamw_update(int64_t i, float* params, const float* grads, float* m, float* v,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           float grad_scale, float inv_bc1, float inv_bc2) {
  const float g = grads[i] * grad_scale;
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  params[i] -= lr * ((mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps) + weight_decay * params[i]);
}

// ---- causal attention per sequence, probabilities kept: item (token n, head h) -----------------
// The sequence of token n: the last s with cu_seqlens[s] <= n (binary search over S+1 entries).
BERTH_HD int sequence_of(int n, const int32_t* cu_seqlens, int S) {
  int lo = 0, hi = S;  // cu_seqlens[lo] <= n < cu_seqlens[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens[mid] <= n) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}
// att_offsets[s] = Σ_{s' < s} NH·L_{s'}² (computed on the host, S+1 entries).
BERTH_HD void attention_forward(int64_t item, float* out, float* att, const float* qkv,
                                const int32_t* cu_seqlens, const int64_t* att_offsets, int S, int C,
                                int NH) {
  const int n = int(item / NH), h = int(item % NH), HS = C / NH;
  const int s = sequence_of(n, cu_seqlens, S);
  const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start, i = n - start;
  const float scale = 1.0f / sqrtf(float(HS));
  float* a = att + att_offsets[s] + int64_t(h) * L * L + int64_t(i) * L;
  const float* q = qkv + int64_t(n) * 3 * C + h * HS;
  float mx = neg_inf();
  for (int j = 0; j <= i; j++) {
    const float* k = qkv + int64_t(start + j) * 3 * C + C + h * HS;
    float d = 0;
    for (int x = 0; x < HS; x++) d += q[x] * k[x];
    a[j] = d * scale;
    mx = a[j] > mx ? a[j] : mx;
  }
  float sum = 0;
  for (int j = 0; j <= i; j++) {
    a[j] = expf(a[j] - mx);
    sum += a[j];
  }
  for (int j = 0; j <= i; j++) a[j] /= sum;
  for (int j = i + 1; j < L; j++) a[j] = 0;
  float* o = out + int64_t(n) * C + h * HS;
  for (int x = 0; x < HS; x++) o[x] = 0;
  for (int j = 0; j <= i; j++) {
    const float* v = qkv + int64_t(start + j) * 3 * C + 2 * C + h * HS;
    for (int x = 0; x < HS; x++) o[x] += a[j] * v[x];
  }
}
// dqkv must be zeroed first (dk and dv rows are shared between queries: atomics).
BERTH_HD void attention_backward(int64_t item, float* dqkv, float* datt, const float* dout,
                                 const float* qkv, const float* att, const int32_t* cu_seqlens,
                                 const int64_t* att_offsets, int S, int C, int NH) {
  const int n = int(item / NH), h = int(item % NH), HS = C / NH;
  const int s = sequence_of(n, cu_seqlens, S);
  const int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start, i = n - start;
  const float scale = 1.0f / sqrtf(float(HS));
  const int64_t row = att_offsets[s] + int64_t(h) * L * L + int64_t(i) * L;
  const float* a = att + row;
  float* da = datt + row;
  const float* d = dout + int64_t(n) * C + h * HS;
  float dot = 0;  // Σ_j a_j · da_j
  for (int j = 0; j <= i; j++) {
    const float* v = qkv + int64_t(start + j) * 3 * C + 2 * C + h * HS;
    float dv = 0;
    for (int x = 0; x < HS; x++) dv += d[x] * v[x];
    da[j] = dv;
    dot += a[j] * dv;
  }
  const float* q = qkv + int64_t(n) * 3 * C + h * HS;
  float* dq = dqkv + int64_t(n) * 3 * C + h * HS;
  for (int j = 0; j <= i; j++) {
    const float ds = a[j] * (da[j] - dot) * scale;
    const float* k = qkv + int64_t(start + j) * 3 * C + C + h * HS;
    float* dk = dqkv + int64_t(start + j) * 3 * C + C + h * HS;
    float* dvj = dqkv + int64_t(start + j) * 3 * C + 2 * C + h * HS;
    for (int x = 0; x < HS; x++) {
      dq[x] += ds * k[x];
      atomic_add(dk + x, ds * q[x]);
      atomic_add(dvj + x, a[j] * d[x]);
    }
  }
}

// ---- causal attention per sequence, flash-style: item (token n, head h) ------------------------
// kHS: the head size C / NH when the caller knows it at compile time (the accumulator then stays
// in registers on a GPU: a runtime-indexed acc[256] lived in local memory, 1 KiB a thread), else 0.
template <int kHS = 0>
BERTH_HD void attention_varlen_forward(int64_t item, float* out, float* lse, const float* qkv,
                                       const int32_t* cu_seqlens, int S, int C, int NH) {
  const int n = int(item / NH), h = int(item % NH), HS = kHS > 0 ? kHS : C / NH;
  const int start = cu_seqlens[sequence_of(n, cu_seqlens, S)];
  const float scale = 1.0f / sqrtf(float(HS));
  const float* q = qkv + int64_t(n) * 3 * C + h * HS;
  float acc[kHS > 0 ? kHS : kMaxHeadSize];
  BERTH_UNROLL
  for (int x = 0; x < HS; x++) acc[x] = 0;
  float m = neg_inf(), l = 0;
  for (int j = start; j <= n; j++) {
    const float* k = qkv + int64_t(j) * 3 * C + C + h * HS;
    float d = 0;
    for (int x = 0; x < HS; x++) d += q[x] * k[x];
    const float sc = d * scale, m_new = sc > m ? sc : m;
    const float corr = expf(m - m_new), p = expf(sc - m_new);
    l = l * corr + p;
    const float* v = qkv + int64_t(j) * 3 * C + 2 * C + h * HS;
    BERTH_UNROLL
    for (int x = 0; x < HS; x++) acc[x] = acc[x] * corr + p * v[x];
    m = m_new;
  }
  float* o = out + int64_t(n) * C + h * HS;
  BERTH_UNROLL
  for (int x = 0; x < HS; x++) o[x] = acc[x] / l;
  lse[item] = m + logf(l);
}
// The fp32 backward, in two passes with no atomics (each thread owns the rows it writes, so the
// result does not depend on scheduling): attention_*_backward_dq, a thread per (query, head),
// adds dQ; attention_*_backward_dkv, a thread per (key, head), adds dK and dV. Both recompute
// P = exp(scores − lse) and dS = P ∘ (dO·vᵀ − delta) / √HS, delta from attention_row_dot. (One
// pass by query with atomics for dK and dV made up to L threads add to one key's row at once.)
//
// Varlen: dqkv (N, 3C) zeroed first; query n sees keys start … n of its sequence.
BERTH_HD void attention_varlen_backward_dq(int64_t item, float* dqkv, const float* dout,
                                           const float* lse, const float* delta, const float* qkv,
                                           const int32_t* cu_seqlens, int S, int C, int NH) {
  const int n = int(item / NH), h = int(item % NH), HS = C / NH;
  const int start = cu_seqlens[sequence_of(n, cu_seqlens, S)];
  const float scale = 1.0f / sqrtf(float(HS));
  const float* q = qkv + int64_t(n) * 3 * C + h * HS;
  const float* d = dout + int64_t(n) * C + h * HS;
  const float l = lse[item], D = delta[item];
  float* dq = dqkv + int64_t(n) * 3 * C + h * HS;
  for (int j = start; j <= n; j++) {
    const float* k = qkv + int64_t(j) * 3 * C + C + h * HS;
    const float* v = qkv + int64_t(j) * 3 * C + 2 * C + h * HS;
    float sdot = 0, dp = 0;
    for (int x = 0; x < HS; x++) sdot += q[x] * k[x], dp += d[x] * v[x];
    const float ds = expf(sdot * scale - l) * (dp - D) * scale;
    for (int x = 0; x < HS; x++) dq[x] += ds * k[x];
  }
}
// Key j is seen by the queries j … end − 1 of its sequence.
BERTH_HD void attention_varlen_backward_dkv(int64_t item, float* dqkv, const float* dout,
                                            const float* lse, const float* delta, const float* qkv,
                                            const int32_t* cu_seqlens, int S, int C, int NH) {
  const int j = int(item / NH), h = int(item % NH), HS = C / NH;
  const int end = cu_seqlens[sequence_of(j, cu_seqlens, S) + 1];
  const float scale = 1.0f / sqrtf(float(HS));
  const float* k = qkv + int64_t(j) * 3 * C + C + h * HS;
  const float* v = k + C;
  float* dk = dqkv + int64_t(j) * 3 * C + C + h * HS;
  float* dv = dk + C;
  for (int i = j; i < end; i++) {
    const float* q = qkv + int64_t(i) * 3 * C + h * HS;
    const float* d = dout + int64_t(i) * C + h * HS;
    float sdot = 0, dp = 0;
    for (int x = 0; x < HS; x++) sdot += q[x] * k[x], dp += d[x] * v[x];
    const int64_t row = int64_t(i) * NH + h;
    const float p = expf(sdot * scale - lse[row]);
    const float ds = p * (dp - delta[row]) * scale;
    for (int x = 0; x < HS; x++) {
      dk[x] += ds * q[x];
      dv[x] += p * d[x];
    }
  }
}

// delta (N, NH) = Σ_x dO·O of token n, head h, the softmax backward's row term: item (n, h)
BERTH_HD void attention_row_dot(int64_t item, float* delta, const float* dout, const float* out,
                                int C, int NH) {
  const int64_t n = item / NH, h = item % NH, HS = C / NH;
  const float* d = dout + n * C + h * HS;
  const float* o = out + n * C + h * HS;
  float D = 0;
  for (int x = 0; x < HS; x++) D += d[x] * o[x];
  delta[item] = D;
}

// ---- attention of a query block against a key/value block (ring attention): item (i, h) --------
BERTH_HD bool sees(const int32_t* q_seq, const int32_t* q_pos, const int32_t* k_seq,
                   const int32_t* k_pos, int i, int j) {
  return k_seq[j] == q_seq[i] && k_pos[j] <= q_pos[i];
}
// Online softmax over the keys the query sees (one pass, never an nq × nk matrix).
// kHS as for attention_varlen_forward.
template <int kHS = 0>
BERTH_HD void attention_block_forward(int64_t item, float* out, float* lse, const float* q,
                                      const float* k, const float* v, const int32_t* q_seq,
                                      const int32_t* q_pos, const int32_t* k_seq,
                                      const int32_t* k_pos, int nk, int C, int NH) {
  const int i = int(item / NH), h = int(item % NH), HS = kHS > 0 ? kHS : C / NH;
  const float scale = 1.0f / sqrtf(float(HS));
  const float* qi = q + int64_t(i) * C + h * HS;
  float acc[kHS > 0 ? kHS : kMaxHeadSize];
  BERTH_UNROLL
  for (int x = 0; x < HS; x++) acc[x] = 0;
  float m = neg_inf(), l = 0;
  for (int j = 0; j < nk; j++) {
    if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
    const float* kj = k + int64_t(j) * C + h * HS;
    float d = 0;
    for (int x = 0; x < HS; x++) d += qi[x] * kj[x];
    const float sc = d * scale, m_new = sc > m ? sc : m;
    const float corr = expf(m - m_new), p = expf(sc - m_new);  // expf(-inf) = 0 on the first key
    l = l * corr + p;
    const float* vj = v + int64_t(j) * C + h * HS;
    BERTH_UNROLL
    for (int x = 0; x < HS; x++) acc[x] = acc[x] * corr + p * vj[x];
    m = m_new;
  }
  float* oi = out + int64_t(i) * C + h * HS;
  if (l == 0) {
    for (int x = 0; x < HS; x++) oi[x] = 0;
    lse[int64_t(i) * NH + h] = neg_inf();
    return;
  }
  BERTH_UNROLL
  for (int x = 0; x < HS; x++) oi[x] = acc[x] / l;
  lse[int64_t(i) * NH + h] = m + logf(l);
}
BERTH_HD void attention_lse_merge(int64_t item, float* out, float* lse, const float* out_b,
                                  const float* lse_b, int C, int NH) {
  const int i = int(item / NH), h = int(item % NH), HS = C / NH;
  float& l = lse[item];
  const float lb = lse_b[item];
  if (lb == neg_inf()) return;
  float* o = out + int64_t(i) * C + h * HS;
  const float* ob = out_b + int64_t(i) * C + h * HS;
  if (l == neg_inf()) {
    for (int x = 0; x < HS; x++) o[x] = ob[x];
    l = lb;
    return;
  }
  const float m = l > lb ? l : lb;
  const float wa = expf(l - m), wb = expf(lb - m), tot = wa + wb;
  for (int x = 0; x < HS; x++) o[x] = (wa * o[x] + wb * ob[x]) / tot;
  l = m + logf(tot);
}
// Ring attention's block, in the same two passes (+= into dq, dk, dv). A query of lse −∞ saw no
// key of the block: nothing flows through it.
BERTH_HD void attention_block_backward_dq(int64_t item, float* dq, const float* dout,
                                          const float* lse, const float* delta, const float* q,
                                          const float* k, const float* v, const int32_t* q_seq,
                                          const int32_t* q_pos, const int32_t* k_seq,
                                          const int32_t* k_pos, int nk, int C, int NH) {
  const int i = int(item / NH), h = int(item % NH), HS = C / NH;
  const float l = lse[item];
  if (l == neg_inf()) return;
  const float D = delta[item];
  const float scale = 1.0f / sqrtf(float(HS));
  const float* qi = q + int64_t(i) * C + h * HS;
  const float* doi = dout + int64_t(i) * C + h * HS;
  float* dqi = dq + int64_t(i) * C + h * HS;
  for (int j = 0; j < nk; j++) {
    if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
    const float* kj = k + int64_t(j) * C + h * HS;
    const float* vj = v + int64_t(j) * C + h * HS;
    float sdot = 0, dp = 0;
    for (int x = 0; x < HS; x++) sdot += qi[x] * kj[x], dp += doi[x] * vj[x];
    const float ds = expf(sdot * scale - l) * (dp - D) * scale;
    for (int x = 0; x < HS; x++) dqi[x] += ds * kj[x];
  }
}
BERTH_HD void attention_block_backward_dkv(int64_t item, float* dk, float* dv, const float* dout,
                                           const float* lse, const float* delta, const float* q,
                                           const float* k, const float* v, const int32_t* q_seq,
                                           const int32_t* q_pos, const int32_t* k_seq,
                                           const int32_t* k_pos, int nq, int C, int NH) {
  const int j = int(item / NH), h = int(item % NH), HS = C / NH;
  const float scale = 1.0f / sqrtf(float(HS));
  const float* kj = k + int64_t(j) * C + h * HS;
  const float* vj = v + int64_t(j) * C + h * HS;
  float* dkj = dk + int64_t(j) * C + h * HS;
  float* dvj = dv + int64_t(j) * C + h * HS;
  for (int i = 0; i < nq; i++) {
    if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
    const int64_t row = int64_t(i) * NH + h;
    const float l = lse[row];
    if (l == neg_inf()) continue;
    const float* qi = q + int64_t(i) * C + h * HS;
    const float* doi = dout + int64_t(i) * C + h * HS;
    float sdot = 0, dp = 0;
    for (int x = 0; x < HS; x++) sdot += qi[x] * kj[x], dp += doi[x] * vj[x];
    const float p = expf(sdot * scale - l);
    const float ds = p * (dp - delta[row]) * scale;
    for (int x = 0; x < HS; x++) {
      dkj[x] += ds * qi[x];
      dvj[x] += p * doi[x];
    }
  }
}

}  // namespace berth::cuda::body
