// Attention of a query block against one key/value block, with the log-sum-exp, its merge, and
// its backward (kernels/ops.h): the per-block pieces of ring attention; and the same online-softmax
// attention over cu_seqlens sequences (attention_varlen_*), which keeps the LSE, not L×L. Masking is by sequence id
// and global position, so blocks of any two CP ranks combine correctly. fp32 with exact exp
// (std::exp): the LSE merge must not accumulate approximation error over cp steps.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.h"

namespace berth::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool sees(const int32_t* q_seq, const int32_t* q_pos, const int32_t* k_seq, const int32_t* k_pos,
          int i, int j) {
  return k_seq[j] == q_seq[i] && k_pos[j] <= q_pos[i];
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const int32_t* q_seq, const int32_t* q_pos,
                             const int32_t* k_seq, const int32_t* k_pos, int nq, int nk, int C,
                             int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel
  {
    std::vector<float> s(static_cast<size_t>(nk));
#pragma omp for schedule(dynamic, 16)
    for (int i = 0; i < nq; ++i) {
      for (int h = 0; h < NH; ++h) {
        const float* qi = q + int64_t(i) * C + h * HS;
        float mx = kNegInf;
        for (int j = 0; j < nk; ++j) {
          if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
          const float* kj = k + int64_t(j) * C + h * HS;
          float d = 0;
          for (int x = 0; x < HS; ++x) d += qi[x] * kj[x];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        float* oi = out + int64_t(i) * C + h * HS;
        for (int x = 0; x < HS; ++x) oi[x] = 0;
        if (mx == kNegInf) {
          lse[int64_t(i) * NH + h] = kNegInf;
          continue;
        }
        float sum = 0;
        for (int j = 0; j < nk; ++j) {
          if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
          const float p = std::exp(s[size_t(j)] - mx);
          sum += p;
          const float* vj = v + int64_t(j) * C + h * HS;
          for (int x = 0; x < HS; ++x) oi[x] += p * vj[x];
        }
        for (int x = 0; x < HS; ++x) oi[x] /= sum;
        lse[int64_t(i) * NH + h] = mx + std::log(sum);
      }
    }
  }
}

void attention_lse_merge(float* out, float* lse, const float* out_b, const float* lse_b, int nq,
                         int C, int NH) {
  const int HS = C / NH;
  for (int i = 0; i < nq; ++i) {
    for (int h = 0; h < NH; ++h) {
      float& l = lse[int64_t(i) * NH + h];
      const float lb = lse_b[int64_t(i) * NH + h];
      if (lb == kNegInf) continue;
      float* o = out + int64_t(i) * C + h * HS;
      const float* ob = out_b + int64_t(i) * C + h * HS;
      if (l == kNegInf) {
        for (int x = 0; x < HS; ++x) o[x] = ob[x];
        l = lb;
        continue;
      }
      const float m = std::max(l, lb);
      const float wa = std::exp(l - m), wb = std::exp(lb - m), tot = wa + wb;
      for (int x = 0; x < HS; ++x) o[x] = (wa * o[x] + wb * ob[x]) / tot;
      l = m + std::log(tot);
    }
  }
}

void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const int32_t* q_seq, const int32_t* q_pos, const int32_t* k_seq,
                              const int32_t* k_pos, int nq, int nk, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(float(HS));
  // Serial over queries: dk and dv rows are shared between them (deterministic order).
  for (int i = 0; i < nq; ++i) {
    for (int h = 0; h < NH; ++h) {
      const float l = lse[int64_t(i) * NH + h];
      if (l == kNegInf) continue;
      const float* qi = q + int64_t(i) * C + h * HS;
      const float* doi = dout + int64_t(i) * C + h * HS;
      const float* oi = out + int64_t(i) * C + h * HS;
      float D = 0;
      for (int x = 0; x < HS; ++x) D += doi[x] * oi[x];
      float* dqi = dq + int64_t(i) * C + h * HS;
      for (int j = 0; j < nk; ++j) {
        if (!sees(q_seq, q_pos, k_seq, k_pos, i, j)) continue;
        const float* kj = k + int64_t(j) * C + h * HS;
        const float* vj = v + int64_t(j) * C + h * HS;
        float sdot = 0, dp = 0;
        for (int x = 0; x < HS; ++x) sdot += qi[x] * kj[x], dp += doi[x] * vj[x];
        const float p = std::exp(sdot * scale - l);
        const float ds = p * (dp - D) * scale;
        float* dkj = dk + int64_t(j) * C + h * HS;
        float* dvj = dv + int64_t(j) * C + h * HS;
        for (int x = 0; x < HS; ++x) {
          dvj[x] += p * doi[x];
          dqi[x] += ds * kj[x];
          dkj[x] += ds * qi[x];
        }
      }
    }
  }
}

// ---- varlen, flash-style ------------------------------------------------------------------------

void attention_varlen_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                              int S, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(HS));
#pragma omp for schedule(dynamic, 1)
    for (int s = 0; s < S; ++s) {
      const int start = cu_seqlens[s], end = cu_seqlens[s + 1];
      for (int n = start; n < end; ++n) {
        for (int h = 0; h < NH; ++h) {
          const float* q = qkv + int64_t(n) * C3 + h * HS;
          float m = kNegInf, l = 0;
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int j = start; j <= n; ++j) {
            const float* k = qkv + int64_t(j) * C3 + C + h * HS;
            float d = 0;
            for (int x = 0; x < HS; ++x) d += q[x] * k[x];
            const float sc = d * scale, m_new = std::max(m, sc);
            const float corr = std::exp(m - m_new), p = std::exp(sc - m_new);
            l = l * corr + p;
            const float* v = qkv + int64_t(j) * C3 + 2 * C + h * HS;
            for (int x = 0; x < HS; ++x) acc[size_t(x)] = acc[size_t(x)] * corr + p * v[x];
            m = m_new;
          }
          float* o = out + int64_t(n) * C + h * HS;
          for (int x = 0; x < HS; ++x) o[x] = acc[size_t(x)] / l;
          lse[int64_t(n) * NH + h] = m + std::log(l);
        }
      }
    }
  }
}

void attention_varlen_backward(float* dqkv, const float* dout, const float* out, const float* lse,
                               const float* qkv, const int32_t* cu_seqlens, int S, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(HS));
  const int64_t N = cu_seqlens[S];
  std::fill(dqkv, dqkv + N * C3, 0.f);
  // Sequences in parallel (they share no rows); queries in order within one (deterministic).
#pragma omp parallel for schedule(dynamic, 1)
  for (int s = 0; s < S; ++s) {
    const int start = cu_seqlens[s], end = cu_seqlens[s + 1];
    for (int n = start; n < end; ++n) {
      for (int h = 0; h < NH; ++h) {
        const float* q = qkv + int64_t(n) * C3 + h * HS;
        const float* d = dout + int64_t(n) * C + h * HS;
        const float* o = out + int64_t(n) * C + h * HS;
        const float l = lse[int64_t(n) * NH + h];
        float D = 0;
        for (int x = 0; x < HS; ++x) D += d[x] * o[x];
        float* dq = dqkv + int64_t(n) * C3 + h * HS;
        for (int j = start; j <= n; ++j) {
          const float* k = qkv + int64_t(j) * C3 + C + h * HS;
          const float* v = qkv + int64_t(j) * C3 + 2 * C + h * HS;
          float sdot = 0, dp = 0;
          for (int x = 0; x < HS; ++x) sdot += q[x] * k[x], dp += d[x] * v[x];
          const float p = std::exp(sdot * scale - l);
          const float ds = p * (dp - D) * scale;
          float* dk = dqkv + int64_t(j) * C3 + C + h * HS;
          float* dv = dqkv + int64_t(j) * C3 + 2 * C + h * HS;
          for (int x = 0; x < HS; ++x) {
            dq[x] += ds * k[x];
            dk[x] += ds * q[x];
            dv[x] += p * d[x];
          }
        }
      }
    }
  }
}

}  // namespace berth::cpu
