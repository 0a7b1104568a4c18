// Causal self-attention per sequence (cu_seqlens), forward and backward (see kernels/ops.h).
//
// For every (sequence, head) pair the scores, softmax and weighted sum are three BLAS GEMMs on
// strided views of qkv; pairs run in parallel (OpenBLAS then runs single-threaded per pair). The
// probabilities are kept in `att` for the backward, one L×L block per pair, zero above the
// diagonal. This is the reference: it materializes L×L per pair, which the CUDA flash kernel will
// not.
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace berth::cpu {
namespace {

// Offset of sequence s's first block in `att` (blocks are ordered by sequence, then head).
int64_t att_offset(const int32_t* cu_seqlens, int s, int NH) {
  int64_t off = 0;
  for (int i = 0; i < s; i++) {
    const int64_t L = cu_seqlens[i + 1] - cu_seqlens[i];
    off += int64_t(NH) * L * L;
  }
  return off;
}

// Where the work item p = (sequence s, head h) reads and writes: row offsets into qkv (N,3C) and
// out (N,C) for head h of the sequence's first token, and its L×L block in att.
struct HeadBlock {
  int L;
  int64_t qkv, out, att;
};

HeadBlock head_block(const int32_t* cu_seqlens, int p, int C, int NH) {
  const int s = p / NH, h = p % NH, HS = C / NH;
  const int64_t start = cu_seqlens[s];
  HeadBlock b;
  b.L = cu_seqlens[s + 1] - cu_seqlens[s];
  b.qkv = start * 3 * C + int64_t(h) * HS;
  b.out = start * C + int64_t(h) * HS;
  b.att = att_offset(cu_seqlens, s, NH) + int64_t(h) * b.L * b.L;
  return b;
}

}  // namespace

int64_t attention_att_size(const int32_t* cu_seqlens, int S, int NH) {
  return att_offset(cu_seqlens, S, NH);
}

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, const int32_t* cu_seqlens, int S, int C,
                       int NH) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(dynamic, 1)
  for (int p = 0; p < S * NH; p++) {
    const HeadBlock b = head_block(cu_seqlens, p, C, NH);
    const int L = b.L;
    if (L == 0) continue;
    const T* q = qkv + b.qkv;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* a = att + b.att;
    gemm(false, true, L, L, HS, scale, q, C3, k, C3, T(0), a, L);  // scores = q kᵀ / sqrt(HS)
    for (int i = 0; i < L; i++) {
      T* row = a + int64_t(i) * L;
      T mx = row[0];
      for (int j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j <= i; j++) {
        row[j] = exp_approx(row[j] - mx);
        sum += row[j];
      }
      const T inv = T(1) / sum;
      for (int j = 0; j <= i; j++) row[j] *= inv;
      for (int j = i + 1; j < L; j++) row[j] = 0;
    }
    T* o = out + b.out;
    gemm(false, false, L, HS, L, T(1), a, L, v, C3, T(0), o, C);  // out = att · v
  }
}

template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att,
                        const int32_t* cu_seqlens, int S, int C, int NH) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for schedule(dynamic, 1)
  for (int p = 0; p < S * NH; p++) {
    const HeadBlock b = head_block(cu_seqlens, p, C, NH);
    const int L = b.L;
    if (L == 0) continue;
    const T* a = att + b.att;
    T* da = datt + b.att;
    const T* q = qkv + b.qkv;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* dq = dqkv + b.qkv;
    T* dk = dq + C;
    T* dv = dq + 2 * C;
    const T* dov = dout + b.out;
    gemm(false, true, L, L, HS, T(1), dov, C, v, C3, T(0), da, L);   // datt = dout · vᵀ
    gemm(true, false, L, HS, L, T(1), a, L, dov, C, T(0), dv, C3);   // dv = attᵀ · dout
    for (int i = 0; i < L; i++) {  // softmax backward, in place: dscores = att ⊙ (datt - Σ att·datt)
      const T* arow = a + int64_t(i) * L;
      T* drow = da + int64_t(i) * L;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j <= i; j++) dot += arow[j] * drow[j];
      for (int j = 0; j <= i; j++) drow[j] = arow[j] * (drow[j] - dot);
      for (int j = i + 1; j < L; j++) drow[j] = 0;
    }
    gemm(false, false, L, HS, L, scale, da, L, k, C3, T(0), dq, C3);  // dq = dscores · k
    gemm(true, false, L, HS, L, scale, da, L, q, C3, T(0), dk, C3);   // dk = dscoresᵀ · q
  }
}

template void attention_forward<float>(float*, float*, const float*, const int32_t*, int, int,
                                       int);
template void attention_forward<double>(double*, double*, const double*, const int32_t*, int, int,
                                        int);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*,
                                        const int32_t*, int, int, int);
template void attention_backward<double>(double*, double*, const double*, const double*,
                                         const double*, const int32_t*, int, int, int);

}  // namespace berth::cpu
