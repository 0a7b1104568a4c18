// Attention of a query block against one key/value block, with the log-sum-exp, its merge, and
// its backward (kernels/ops.h): the per-block pieces of ring attention. Masking is by sequence id
// and global position, so blocks of any two CP ranks combine correctly. fp32 with exact exp
// (std::exp): the LSE merge must not accumulate approximation error over cp steps.
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

}  // namespace berth::cpu
