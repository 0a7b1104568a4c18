// An eager attention oracle for the bf16 attention tests (test_backend, test_context_parallel):
// the fp64 reference and the "naive bf16 implementation" the issue measures flash attention
// against, and the check that a result is within twice the naive one's error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace berth::test {

// Attention of nq queries over nk keys, query i seeing key j where sees(i, j), as eager code
// computes it when every tensor it stores is rounded by `r`: S = r(q·k/√HS), P = r(softmax(S)),
// O = r(P·V); dV = r(Pᵀ·dO), dP = r(dO·Vᵀ), dS = r(P ∘ (dP − rowsum(P ∘ dP))), dQ = r(dS·K)/√HS,
// dK = r(dSᵀ·Q)/√HS, with q, k, v, dO rounded first. r = identity is the fp64 reference;
// r = round_to_bf16 is the "naive bf16 implementation" (PyTorch's math attention under bf16) the
// issue measures flash attention against. q (nq, C), k and v (nk, C); a query that sees nothing
// gets out 0 and lse −inf.
struct EagerAttention {
  std::vector<double> out, lse, dq, dk, dv;
};
template <typename Sees, typename R>
EagerAttention eager_attention(const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& dout, int C,
                               int NH, Sees sees, R r) {
  const int nq = int(q.size()) / C, nk = int(k.size()) / C, HS = C / NH;
  const double scale = 1.0 / std::sqrt(double(HS));
  EagerAttention e{std::vector<double>(q.size()), std::vector<double>(size_t(nq) * NH),
                   std::vector<double>(q.size()), std::vector<double>(k.size()),
                   std::vector<double>(k.size())};
  auto at = [&](const std::vector<float>& t, int row, int h, int x) {
    return r(double(t[size_t(row) * C + h * HS + x]));
  };
  for (int h = 0; h < NH; ++h) {
    std::vector<double> P(size_t(nq) * nk, 0.0), dS(P.size(), 0.0);
    for (int i = 0; i < nq; ++i) {
      std::vector<double> S(size_t(nk), -INFINITY);
      double mx = -INFINITY;
      for (int j = 0; j < nk; ++j) {
        if (!sees(i, j)) continue;
        double d = 0;
        for (int x = 0; x < HS; ++x) d += at(q, i, h, x) * at(k, j, h, x);
        S[size_t(j)] = r(d * scale), mx = std::max(mx, S[size_t(j)]);
      }
      double sum = 0;
      for (int j = 0; j < nk; ++j) sum += sees(i, j) ? std::exp(S[size_t(j)] - mx) : 0.0;
      e.lse[size_t(i) * NH + h] = sum > 0 ? mx + std::log(sum) : -INFINITY;
      for (int j = 0; j < nk; ++j)
        if (sees(i, j)) P[size_t(i) * nk + j] = r(std::exp(S[size_t(j)] - mx) / sum);
      for (int x = 0; x < HS; ++x) {
        double o = 0;
        for (int j = 0; j < nk; ++j) o += P[size_t(i) * nk + j] * at(v, j, h, x);
        e.out[size_t(i) * C + h * HS + x] = r(o);
      }
      std::vector<double> dP(size_t(nk), 0.0);
      double D = 0;
      for (int j = 0; j < nk; ++j) {
        if (!sees(i, j)) continue;
        double d = 0;
        for (int x = 0; x < HS; ++x) d += at(dout, i, h, x) * at(v, j, h, x);
        dP[size_t(j)] = r(d), D += P[size_t(i) * nk + j] * dP[size_t(j)];
      }
      for (int j = 0; j < nk; ++j)
        if (sees(i, j)) dS[size_t(i) * nk + j] = r(P[size_t(i) * nk + j] * (dP[size_t(j)] - D));
    }
    for (int x = 0; x < HS; ++x) {
      for (int i = 0; i < nq; ++i) {
        double dq = 0;
        for (int j = 0; j < nk; ++j) dq += dS[size_t(i) * nk + j] * at(k, j, h, x);
        e.dq[size_t(i) * C + h * HS + x] = r(dq) * scale;
      }
      for (int j = 0; j < nk; ++j) {
        double dk = 0, dv = 0;
        for (int i = 0; i < nq; ++i) {
          dk += dS[size_t(i) * nk + j] * at(q, i, h, x);
          dv += P[size_t(i) * nk + j] * at(dout, i, h, x);
        }
        e.dk[size_t(j) * C + h * HS + x] = r(dk) * scale;
        e.dv[size_t(j) * C + h * HS + x] = r(dv);
      }
    }
  }
  return e;
}
inline double identity(double x) { return x; }
inline double bf16_round(double x) { return double(cpu::round_to_bf16(float(x))); }

// Columns [part·C, (part+1)·C) of an (N, 3C) tensor.
template <typename T>
std::vector<T> third(const std::vector<T>& qkv, int C, int part) {
  std::vector<T> t;
  for (size_t row = 0; row < qkv.size() / size_t(3 * C); ++row) {
    const auto from = qkv.begin() + long(row * 3 * C) + part * C;
    t.insert(t.end(), from, from + C);
  }
  return t;
}

// ‖got − ref‖₂ / ‖ref‖₂
inline double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    d2 += (got[i] - ref[i]) * (got[i] - ref[i]), r2 += ref[i] * ref[i];
  return std::sqrt(d2 / r2);
}
// max |got − ref| over the finite entries of ref (a −inf must stay −inf)
inline double lse_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << "lse " << i << " must be -inf";
    } else {
      worst = std::max(worst, std::fabs(got[i] - ref[i]));
    }
  }
  return worst;
}
// The backend's bf16 attention `got` against the fp64 reference: each of out, LSE, dQ, dK, dV
// within twice the error of the naive bf16 implementation, and above 1e-5 (bf16 ran).
inline void expect_within_twice_naive(const EagerAttention& got, const EagerAttention& ref,
                                      const EagerAttention& naive, const std::string& label) {
  const struct {
    const char* what;
    double got, naive;
  } rows[] = {
      {"out", rel_l2(got.out, ref.out), rel_l2(naive.out, ref.out)},
      {"lse (max abs)", lse_error(got.lse, ref.lse), lse_error(naive.lse, ref.lse)},
      {"dq", rel_l2(got.dq, ref.dq), rel_l2(naive.dq, ref.dq)},
      {"dk", rel_l2(got.dk, ref.dk), rel_l2(naive.dk, ref.dk)},
      {"dv", rel_l2(got.dv, ref.dv), rel_l2(naive.dv, ref.dv)},
  };
  for (const auto& r : rows) {
    std::printf("%s %-14s error %.3g (naive bf16 %.3g, ratio %.2f)\n", label.c_str(), r.what, r.got,
                r.naive, r.got / r.naive);
    EXPECT_LE(r.got, 2 * r.naive) << label << " " << r.what;
    EXPECT_GT(r.got, 1e-5) << label << " " << r.what
                           << ": no bf16 rounding in it, so not the bf16 kernels";
  }
}
}  // namespace berth::test
