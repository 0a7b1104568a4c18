// Tests for the CPU reference kernels (kernels/ops.h): every backward against central finite
// differences in fp64, the accumulate/overwrite contract, cu_seqlens packing and causality,
// cross-entropy over a padded vocabulary, AdamW, sum_squares, and float against double.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "tests/tolerance.h"

namespace berth::test {
namespace {

using namespace berth::cpu;
using Vec = std::vector<double>;
using Ids = std::vector<int32_t>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kH = 1e-6;        // finite-difference step
constexpr double kPrefill = 0.25;  // where an accumulated (+=) gradient starts; exact in binary

// ---- helpers ------------------------------------------------------------------------------------

// n values uniform in [lo, hi) from a fixed seed, rounded to float so the float and double
// instantiations can run on the same inputs.
Vec random_vec(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = double(float(dist(rng)));
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// An accumulated gradient minus the value its buffer was pre-filled with.
Vec minus_prefill(Vec g) {
  for (double& x : g) x -= kPrefill;
  return g;
}

void expect_vec(const Vec& got, const Vec& ref, Tol tol, const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  expect_close(got.data(), ref.data(), int64_t(got.size()), tol, what);
}

// `analytic` against central differences of loss() w.r.t. every element of x (x is restored).
void expect_grad(Vec& x, const Vec& analytic, const std::function<double()>& loss,
                 const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  Vec numeric(x.size());
  double largest = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + kH;
    const double up = loss();
    x[i] = x0 - kH;
    const double down = loss();
    x[i] = x0;
    numeric[i] = (up - down) / (2 * kH);
    largest = std::max(largest, std::fabs(numeric[i]));
  }
  EXPECT_GT(largest, 1e-3) << what << ": the loss does not depend on this input (test wiring)";
  expect_vec(analytic, numeric, kFiniteDiffF64, what);
}

// ---- encoder ------------------------------------------------------------------------------------

TEST(Encoder, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 6, C = 40, Vp = 16, maxT = 4;  // C = 40: two channel chunks, the second partial
  const Ids tokens{3, 1, 3, 0, 9, 3}, positions{0, 1, 2, 0, 1, 2};
  Vec wte = random_vec(Vp * C, 1), wpe = random_vec(maxT * C, 2), R = random_vec(N * C, 3);
  Vec out(N * C, kNaN);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
    return dot(out, R);
  };
  loss();
  Vec ref(N * C);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) ref[n * C + c] = wte[tokens[n] * C + c] + wpe[positions[n] * C + c];
  expect_vec(out, ref, kExact, "encoder out");

  Vec dwte(Vp * C, kPrefill), dwpe(maxT * C, kPrefill);
  encoder_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), positions.data(), N, C);
  expect_grad(wte, minus_prefill(dwte), loss, "encoder dwte (+=)");
  expect_grad(wpe, minus_prefill(dwpe), loss, "encoder dwpe (+=)");
}

// ---- layernorm ----------------------------------------------------------------------------------

TEST(Layernorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 6, C = 20;  // C = 20: two channel chunks in the parameter pass, one partial
  Vec inp = random_vec(N * C, 11), w = random_vec(C, 12, 0.5, 1.5), b = random_vec(C, 13);
  Vec R = random_vec(N * C, 14), out(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  Vec ref(N * C), ref_mean(N), ref_rstd(N);
  for (int n = 0; n < N; n++) {
    long double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) var += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    const long double s = 1 / std::sqrt(var / C + 1e-5L);
    for (int c = 0; c < C; c++) ref[n * C + c] = double((inp[n * C + c] - m) * s * w[c] + b[c]);
    ref_mean[n] = double(m);
    ref_rstd[n] = double(s);
  }
  expect_vec(out, ref, kRoundingF64, "layernorm out");
  expect_vec(mean, ref_mean, kRoundingF64, "layernorm mean");
  expect_vec(rstd, ref_rstd, kRoundingF64, "layernorm rstd");

  Vec dinp(N * C, kPrefill), dw(C, kPrefill), db(C, kPrefill);  // all three accumulate
  layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  expect_grad(inp, minus_prefill(dinp), loss, "layernorm dinp (+=)");
  expect_grad(w, minus_prefill(dw), loss, "layernorm dweight (+=)");
  expect_grad(b, minus_prefill(db), loss, "layernorm dbias (+=)");
}

// ---- matmul -------------------------------------------------------------------------------------

void check_matmul(bool with_bias, int OC) {
  const int N = 6, IC = 8;
  Vec inp = random_vec(N * IC, 21), w = random_vec(OC * IC, 22), b = random_vec(OC, 23);
  Vec R = random_vec(N * OC, 24), out(N * OC, kNaN);
  auto bias = [&] { return with_bias ? b.data() : nullptr; };
  auto loss = [&] {
    matmul_forward(out.data(), inp.data(), w.data(), bias(), N, IC, OC);
    return dot(out, R);
  };
  loss();
  Vec ref(N * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double acc = with_bias ? b[o] : 0;
      for (int i = 0; i < IC; i++) acc += inp[n * IC + i] * w[o * IC + i];
      ref[n * OC + o] = acc;
    }
  expect_vec(out, ref, kRoundingF64, "matmul out");

  Vec dinp(N * IC, kNaN), dw(OC * IC, kPrefill), db(OC, kPrefill);  // dinp overwrites
  matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(), inp.data(),
                  w.data(), N, IC, OC);
  expect_grad(inp, dinp, loss, "matmul dinp (=)");
  expect_grad(w, minus_prefill(dw), loss, "matmul dweight (+=)");
  if (with_bias) expect_grad(b, minus_prefill(db), loss, "matmul dbias (+=)");

  // dinp = nullptr skips the input gradient; the parameter gradients are the same.
  Vec dw2(OC * IC, kPrefill), db2(OC, kPrefill);
  matmul_backward<double>(nullptr, dw2.data(), with_bias ? db2.data() : nullptr, R.data(),
                          inp.data(), w.data(), N, IC, OC);
  expect_vec(dw2, dw, kExact, "matmul dweight with dinp = nullptr");
  expect_vec(db2, with_bias ? db : Vec(OC, kPrefill), kExact, "matmul dbias with dinp = nullptr");
}

TEST(Matmul, BackwardWithBiasMatchesFiniteDifferences) { check_matmul(true, 18); }
TEST(Matmul, BackwardWithoutBiasMatchesFiniteDifferences) { check_matmul(false, 5); }

// ---- attention ----------------------------------------------------------------------------------

// Naive causal attention: out (N,C) and the probabilities in attention_forward's `att` layout.
void attention_reference(Vec& out, Vec& att, const Vec& qkv, const Ids& cu, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  int64_t off = 0;
  for (size_t s = 0; s + 1 < cu.size(); s++) {
    const int start = cu[s], L = cu[s + 1] - cu[s];
    for (int h = 0; h < NH; h++, off += int64_t(L) * L) {
      for (int i = 0; i < L; i++) {
        Vec p(L, 0.0);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; j++) {
          for (int d = 0; d < HS; d++)
            p[j] += qkv[(start + i) * C3 + h * HS + d] * qkv[(start + j) * C3 + C + h * HS + d];
          p[j] /= std::sqrt(double(HS));
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= i; j++) sum += p[j] = std::exp(p[j] - mx);
        for (int j = 0; j <= i; j++) p[j] /= sum;
        for (int j = 0; j < L; j++) att[off + int64_t(i) * L + j] = p[j];
        for (int d = 0; d < HS; d++) {
          double acc = 0;
          for (int j = 0; j <= i; j++) acc += p[j] * qkv[(start + j) * C3 + 2 * C + h * HS + d];
          out[(start + i) * C + h * HS + d] = acc;
        }
      }
    }
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  const int C = 8, NH = 2;
  const Ids cu{0, 3, 4, 9};  // three sequences of lengths 3, 1, 5
  const int S = 3, N = 9;
  Vec qkv = random_vec(N * 3 * C, 31), R = random_vec(N * C, 32), out(N * C, kNaN);
  Vec att(attention_att_size(cu.data(), S, NH), kNaN);
  ASSERT_EQ(att.size(), size_t(NH * (9 + 1 + 25)));
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
    return dot(out, R);
  };
  loss();
  Vec ref(N * C), ref_att(att.size());
  attention_reference(ref, ref_att, qkv, cu, C, NH);
  expect_vec(out, ref, kRoundingF64, "attention out");
  expect_vec(att, ref_att, kRoundingF64, "attention att (zero above the diagonal)");

  Vec dqkv(N * 3 * C, kNaN), datt(att.size(), kNaN);  // dqkv overwrites; datt is scratch
  attention_backward(dqkv.data(), datt.data(), R.data(), qkv.data(), att.data(), cu.data(), S, C,
                     NH);
  expect_grad(qkv, dqkv, loss, "attention dqkv (=)");
}

TEST(Attention, PackedSequencesEqualEachSequenceAlone) {
  const int C = 8, NH = 2, C3 = 3 * C;
  const Ids cu{0, 3, 7, 12, 13};  // lengths 3, 4, 5, 1
  const int S = 4, N = 13;
  const Vec qkv = random_vec(N * C3, 41), dout = random_vec(N * C, 42);
  const int64_t att_size = attention_att_size(cu.data(), S, NH);
  Vec out(N * C), att(att_size), dqkv(N * C3), datt(att_size);
  attention_forward(out.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
  attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), cu.data(), S, C,
                     NH);
  // Each sequence alone, at the same addresses (same alignment, so the same BLAS code paths).
  Vec out1(N * C, kNaN), att1(att_size, kNaN), dqkv1(N * C3, kNaN), datt1(att_size, kNaN);
  for (int s = 0; s < S; s++) {
    const Ids one{0, cu[s + 1] - cu[s]};
    const int64_t t0 = cu[s], a0 = attention_att_size(cu.data(), s, NH);
    attention_forward(out1.data() + t0 * C, att1.data() + a0, qkv.data() + t0 * C3, one.data(), 1,
                      C, NH);
    attention_backward(dqkv1.data() + t0 * C3, datt1.data() + a0, dout.data() + t0 * C,
                       qkv.data() + t0 * C3, att1.data() + a0, one.data(), 1, C, NH);
  }
  expect_vec(out1, out, kExact, "attention out, per sequence vs packed");
  expect_vec(att1, att, kExact, "attention att, per sequence vs packed");
  expect_vec(dqkv1, dqkv, kExact, "attention dqkv, per sequence vs packed");
}

TEST(Attention, LaterTokensDoNotChangeEarlierOutputs) {
  const int C = 8, NH = 2, C3 = 3 * C;
  const Ids cu{0, 3, 7, 12};
  const int S = 3, N = 12, changed = 5;  // third token of the second sequence [3, 7)
  Vec qkv = random_vec(N * C3, 51), out(N * C), out2(N * C);
  Vec att(attention_att_size(cu.data(), S, NH));
  attention_forward(out.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
  for (int c = C; c < C3; c++) qkv[changed * C3 + c] += 0.5;  // its k and v
  attention_forward(out2.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
  for (int n = 0; n < N; n++) {
    const bool may_change = n >= changed && n < 7;  // same sequence, at or after the token
    bool changed_row = false;
    for (int c = 0; c < C; c++) changed_row |= out[n * C + c] != out2[n * C + c];
    EXPECT_EQ(changed_row, may_change) << "attention output row " << n;
  }
}

// ---- GELU and residual --------------------------------------------------------------------------

TEST(Gelu, BackwardMatchesFiniteDifferencesAndMayAliasDout) {
  const int n = 48;
  Vec inp = random_vec(n, 61, -4, 4), R = random_vec(n, 62), out(n, kNaN), ref(n);
  auto loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return dot(out, R);
  };
  loss();
  const long double k = std::sqrt(2 / std::numbers::pi_v<long double>);
  for (int i = 0; i < n; i++) {
    const long double x = inp[i];
    ref[i] = double(0.5L * x * (1 + std::tanh(k * (x + 0.044715L * x * x * x))));
  }
  expect_vec(out, ref, kRoundingF64, "gelu out");

  Vec dinp(n, kNaN);
  gelu_backward(dinp.data(), inp.data(), R.data(), n);
  expect_grad(inp, dinp, loss, "gelu dinp (=)");
  Vec in_place = R;
  gelu_backward(in_place.data(), inp.data(), in_place.data(), n);
  expect_vec(in_place, dinp, kExact, "gelu dinp aliasing dout");
}

TEST(Residual, AddsAndMayAliasAnInput) {
  const int n = 40;
  const Vec a = random_vec(n, 63), b = random_vec(n, 64);
  Vec out(n, kNaN), ref(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (int i = 0; i < n; i++) ref[i] = a[i] + b[i];
  expect_vec(out, ref, kExact, "residual out");
  Vec in_place = a;
  residual_forward(in_place.data(), in_place.data(), b.data(), n);
  expect_vec(in_place, ref, kExact, "residual out aliasing a");
}

// ---- cross-entropy ------------------------------------------------------------------------------

// N = 6 rows over V = 11 real and Vp = 16 padded columns; two rows have no target.
struct CeCase {
  static constexpr int N = 6, V = 11, Vp = 16;
  const Ids targets{3, -1, 10, 0, -1, 7};
  const double dloss = 1.0 / 4;  // mean over the 4 target tokens
  Vec logits = random_vec(N * Vp, 71, -2, 2);

  Vec losses() const {
    Vec l(N, kNaN);
    crossentropy_forward(l.data(), logits.data(), targets.data(), N, V, Vp);
    return l;
  }
  Vec dlogits() const {
    Vec d(N * Vp, kNaN);
    crossentropy_backward(d.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    return d;
  }
};

TEST(CrossEntropy, ForwardMatchesLogSumExpMinusTargetLogit) {
  const CeCase ce;
  Vec ref(ce.N, 0.0);
  for (int n = 0; n < ce.N; n++) {
    if (ce.targets[n] < 0) continue;  // ignored: loss 0
    long double sum = 0;
    for (int v = 0; v < ce.V; v++) sum += std::exp((long double)ce.logits[n * ce.Vp + v]);
    ref[n] = double(std::log(sum) - ce.logits[n * ce.Vp + ce.targets[n]]);
  }
  expect_vec(ce.losses(), ref, kRoundingF64, "crossentropy losses");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  CeCase ce;
  const Vec d = ce.dlogits();
  auto loss = [&] { return ce.dloss * dot(ce.losses(), Vec(ce.N, 1.0)); };
  expect_grad(ce.logits, d, loss, "crossentropy dlogits (=)");
  // Probabilities p = dlogits/dloss + onehot: zero in padded columns, summing to 1 over V.
  for (int n = 0; n < ce.N; n++) {
    double sum = 0;
    for (int v = 0; v < ce.Vp; v++) {
      const double g = d[n * ce.Vp + v];
      if (v >= ce.V || ce.targets[n] < 0) {
        EXPECT_EQ(g, 0.0) << "row " << n << " column " << v;
      }
      if (v < ce.V) sum += g / ce.dloss + (v == ce.targets[n] ? 1 : 0);
    }
    const double expected = ce.targets[n] < 0 ? 0 : 1;
    expect_close(&sum, &expected, 1, kRoundingF64, "crossentropy probabilities summed over V");
  }
}

TEST(CrossEntropy, BackwardInPlaceEqualsOutOfPlace) {
  const CeCase ce;
  Vec in_place = ce.logits;
  crossentropy_backward(in_place.data(), in_place.data(), ce.targets.data(), ce.dloss, ce.N, ce.V,
                        ce.Vp);
  expect_vec(in_place, ce.dlogits(), kExact, "crossentropy dlogits in place");
}

TEST(CrossEntropy, PaddedColumnsNeverTakePart) {
  const CeCase ce;
  CeCase huge;
  for (int n = 0; n < ce.N; n++)
    for (int v = ce.V; v < ce.Vp; v++) huge.logits[n * ce.Vp + v] = v % 2 ? 1e30 : -1e30;
  expect_vec(huge.losses(), ce.losses(), kExact, "crossentropy losses, huge padded logits");
  expect_vec(huge.dlogits(), ce.dlogits(), kExact, "crossentropy dlogits, huge padded logits");
}

// ---- composition: one GPT-2 layer ---------------------------------------------------------------

// encoder → ln1 → qkv → attention → proj → +residual → ln2 → fc → gelu → fcproj → +residual → lnf
// → logits (tied wte) → cross-entropy, with the backward composed from the ops as the model does:
// residual gradients flow through layernorm_backward's accumulating dinp, and dwte sums the
// encoder and the logits matmul.
struct MiniGpt {
  static constexpr int N = 6, C = 8, NH = 2, V = 11, Vp = 16, maxT = 3, S = 2;
  const Ids tokens{1, 4, 10, 4, 0, 7}, positions{0, 1, 2, 0, 1, 2}, cu{0, 3, 6};
  const Ids targets{4, 10, -1, 0, 7, 2};
  const double dloss = 1.0 / 5;
  Vec wte = random_vec(Vp * C, 81), wpe = random_vec(maxT * C, 82);
  Vec ln1w = random_vec(C, 83, 0.5, 1.5), ln1b = random_vec(C, 84);
  Vec wqkv = random_vec(3 * C * C, 85), bqkv = random_vec(3 * C, 86);
  Vec wproj = random_vec(C * C, 87), bproj = random_vec(C, 88);
  Vec ln2w = random_vec(C, 89, 0.5, 1.5), ln2b = random_vec(C, 90);
  Vec wfc = random_vec(4 * C * C, 91), bfc = random_vec(4 * C, 92);
  Vec wfcp = random_vec(4 * C * C, 93), bfcp = random_vec(C, 94);
  Vec lnfw = random_vec(C, 95, 0.5, 1.5), lnfb = random_vec(C, 96);
  std::vector<Vec*> params() {
    return {&wte,  &wpe,  &ln1w, &ln1b, &wqkv, &bqkv, &wproj, &bproj,
            &ln2w, &ln2b, &wfc,  &bfc,  &wfcp, &bfcp, &lnfw,  &lnfb};
  }
  // activations
  Vec x = Vec(N * C), ln1 = x, res1 = x, ln2 = x, res2 = x, lnf = x, atty = x, proj = x, fcp = x;
  Vec mean1 = Vec(N), rstd1 = mean1, mean2 = mean1, rstd2 = mean1, meanf = mean1, rstdf = mean1;
  Vec qkv = Vec(N * 3 * C), fc = Vec(N * 4 * C), fcg = fc, logits = Vec(N * Vp), losses = Vec(N);
  Vec att = Vec(attention_att_size(cu.data(), S, NH));

  double forward() {
    encoder_forward(x.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
    layernorm_forward(ln1.data(), mean1.data(), rstd1.data(), x.data(), ln1w.data(), ln1b.data(), N,
                      C);
    matmul_forward(qkv.data(), ln1.data(), wqkv.data(), bqkv.data(), N, C, 3 * C);
    attention_forward(atty.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
    matmul_forward(proj.data(), atty.data(), wproj.data(), bproj.data(), N, C, C);
    residual_forward(res1.data(), x.data(), proj.data(), N * C);
    layernorm_forward(ln2.data(), mean2.data(), rstd2.data(), res1.data(), ln2w.data(), ln2b.data(),
                      N, C);
    matmul_forward(fc.data(), ln2.data(), wfc.data(), bfc.data(), N, C, 4 * C);
    gelu_forward(fcg.data(), fc.data(), N * 4 * C);
    matmul_forward(fcp.data(), fcg.data(), wfcp.data(), bfcp.data(), N, 4 * C, C);
    residual_forward(res2.data(), res1.data(), fcp.data(), N * C);
    layernorm_forward(lnf.data(), meanf.data(), rstdf.data(), res2.data(), lnfw.data(), lnfb.data(),
                      N, C);
    matmul_forward<double>(logits.data(), lnf.data(), wte.data(), nullptr, N, C, Vp);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
    return dloss * dot(losses, Vec(N, 1.0));
  }

  // Gradients of forward()'s loss, in params() order; call after forward().
  std::vector<Vec> backward() {
    std::vector<Vec> g;
    for (Vec* p : params()) g.emplace_back(p->size(), 0.0);
    Vec dlogits(N * Vp), dlnf(N * C), dres(N * C, 0.0), dfcg(N * 4 * C), dfc(N * 4 * C);
    Vec dln2(N * C), datty(N * C), dqkv(N * 3 * C), datt(att.size()), dln1(N * C);
    crossentropy_backward(dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    matmul_backward<double>(dlnf.data(), g[0].data(), nullptr, dlogits.data(), lnf.data(),
                            wte.data(), N, C, Vp);
    layernorm_backward(dres.data(), g[14].data(), g[15].data(), dlnf.data(), res2.data(),
                       lnfw.data(), meanf.data(), rstdf.data(), N, C);
    matmul_backward(dfcg.data(), g[12].data(), g[13].data(), dres.data(), fcg.data(), wfcp.data(),
                    N, 4 * C, C);
    gelu_backward(dfc.data(), fc.data(), dfcg.data(), N * 4 * C);
    matmul_backward(dln2.data(), g[10].data(), g[11].data(), dfc.data(), ln2.data(), wfc.data(), N,
                    C, 4 * C);
    layernorm_backward(dres.data(), g[8].data(), g[9].data(), dln2.data(), res1.data(), ln2w.data(),
                       mean2.data(), rstd2.data(), N, C);
    matmul_backward(datty.data(), g[6].data(), g[7].data(), dres.data(), atty.data(), wproj.data(),
                    N, C, C);
    attention_backward(dqkv.data(), datt.data(), datty.data(), qkv.data(), att.data(), cu.data(), S,
                       C, NH);
    matmul_backward(dln1.data(), g[4].data(), g[5].data(), dqkv.data(), ln1.data(), wqkv.data(), N,
                    C, 3 * C);
    layernorm_backward(dres.data(), g[2].data(), g[3].data(), dln1.data(), x.data(), ln1w.data(),
                       mean1.data(), rstd1.data(), N, C);
    encoder_backward(g[0].data(), g[1].data(), dres.data(), tokens.data(), positions.data(), N, C);
    return g;
  }
};

TEST(Composition, GptLayerBackwardMatchesFiniteDifferences) {
  MiniGpt model;
  model.forward();
  const std::vector<Vec> grads = model.backward();
  const char* names[] = {"gpt dwte",  "gpt dwpe",  "gpt dln1w",  "gpt dln1b",
                         "gpt dwqkv", "gpt dbqkv", "gpt dwproj", "gpt dbproj",
                         "gpt dln2w", "gpt dln2b", "gpt dwfc",   "gpt dbfc",
                         "gpt dwfcp", "gpt dbfcp", "gpt dlnfw",  "gpt dlnfb"};
  const std::vector<Vec*> params = model.params();
  for (size_t i = 0; i < params.size(); i++)
    expect_grad(
        *params[i], grads[i], [&] { return model.forward(); }, names[i]);
}

// ---- AdamW --------------------------------------------------------------------------------------

// The AdamW step of ops.h, written out in double with the float hyperparameters as passed.
void adamw_reference(Vec& p, const Vec& grad, Vec& m, Vec& v, float lr, float b1, float b2,
                     float eps, float wd, float scale, int t) {
  for (size_t i = 0; i < p.size(); i++) {
    const double g = grad[i] * double(scale);
    m[i] = double(b1) * m[i] + (1 - double(b1)) * g;
    v[i] = double(b2) * v[i] + (1 - double(b2)) * g * g;
    const double m_hat = m[i] / (1 - std::pow(double(b1), t));
    const double v_hat = v[i] / (1 - std::pow(double(b2), t));
    p[i] -= double(lr) * (m_hat / (std::sqrt(v_hat) + double(eps)) + double(wd) * p[i]);
  }
}

void check_adamw(float wd) {
  const int n = 37;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, scale = 0.5f;
  const Vec p0 = random_vec(n, 101), g1 = random_vec(n, 102), g2 = random_vec(n, 103);
  Vec p = p0, m(n, 0.0), v(n, 0.0), rp = p0, rm = m, rv = v;
  adamw_update(p.data(), g1.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, scale, 1);
  adamw_reference(rp, g1, rm, rv, lr, b1, b2, eps, wd, scale, 1);
  expect_vec(p, rp, kRoundingF64, "adamw params, step 1");
  expect_vec(m, rm, kRoundingF64, "adamw m, step 1");
  expect_vec(v, rv, kRoundingF64, "adamw v, step 1");
  // Independent of the transcription above: at step 1 the bias corrections make m̂ = g and
  // v̂ = g², so without weight decay every parameter moves by lr·g/(|g| + eps) ≈ lr·sign(g).
  if (wd == 0) {
    Vec moved(n);
    for (int i = 0; i < n; i++) {
      const double g = g1[i] * double(scale);
      moved[i] = p0[i] - double(lr) * g / (std::fabs(g) + double(eps));
    }
    expect_vec(p, moved, kRoundingF64, "adamw step 1 = p - lr g/(|g| + eps)");
  }
  adamw_update(p.data(), g2.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, scale, 2);
  adamw_reference(rp, g2, rm, rv, lr, b1, b2, eps, wd, scale, 2);
  expect_vec(p, rp, kRoundingF64, "adamw params, step 2");
  expect_vec(m, rm, kRoundingF64, "adamw m, step 2");
  expect_vec(v, rv, kRoundingF64, "adamw v, step 2");
}

TEST(AdamW, TwoStepsMatchTheFormula) { check_adamw(0.1f); }
TEST(AdamW, TwoStepsWithoutWeightDecayMatchTheFormula) { check_adamw(0.0f); }

// ---- sum_squares --------------------------------------------------------------------------------

// sum_squares<T>(x) with the OpenMP thread count set to `threads` (restored after).
template <typename T>
double sum_squares_on(const std::vector<T>& x, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const double s = sum_squares(x.data(), int64_t(x.size()));
  omp_set_num_threads(saved);
  return s;
}

TEST(SumSquares, MatchesADirectSumInDouble) {
  const Vec x = random_vec(1000, 111, -3, 3);
  long double ref = 0;
  for (double e : x) ref += (long double)e * e;
  const double want = double(ref), got = sum_squares_on(x, 2);
  expect_close(&got, &want, 1, kRoundingF64, "sum_squares<double>");
  // float input accumulated in double: squares of 1 + 2^-12 need 25 bits, more than a float holds.
  const std::vector<float> xf(1000, 1.0f + 0x1p-12f);
  const double got_f = sum_squares_on(xf, 2), want_f = 1000 * (1 + 0x1p-12) * (1 + 0x1p-12);
  expect_close(&got_f, &want_f, 1, kRoundingF64, "sum_squares<float> accumulates in double");
}

TEST(SumSquares, OneAndTwoThreadsAgree) {
  // Multiples of 1/8: every partial sum is exact, so any thread count gives the same bits.
  Vec exact(1001);
  for (size_t i = 0; i < exact.size(); i++) exact[i] = double(int(i % 97) - 48) / 8;
  const double e1 = sum_squares_on(exact, 1), e2 = sum_squares_on(exact, 2);
  const double e3 = sum_squares_on(exact, 3);
  expect_close(&e2, &e1, 1, kExact, "sum_squares, exact inputs, 2 vs 1 threads");
  expect_close(&e3, &e1, 1, kExact, "sum_squares, exact inputs, 3 vs 1 threads");
  // Random inputs: the order changes with the thread count but not between runs.
  const Vec x = random_vec(1000, 112);
  const double r1 = sum_squares_on(x, 1), r2 = sum_squares_on(x, 2), r2b = sum_squares_on(x, 2);
  expect_close(&r2, &r1, 1, kSerialVsParallelSumF64, "sum_squares, 2 vs 1 threads");
  expect_close(&r2b, &r2, 1, kExact, "sum_squares, 2 threads, run twice");
}

// ---- float vs double ----------------------------------------------------------------------------

template <typename T>
std::vector<T> as(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Every forward and backward of ops.h in precision T on the same float-representable inputs:
// (name, output in double) pairs.
template <typename T>
std::vector<std::pair<const char*, Vec>> all_ops() {
  const int N = 6, C = 8, NH = 2, OC = 5, V = 11, Vp = 16, S = 3;
  const Ids tokens{3, 1, 3, 0, 9, 3}, positions{0, 1, 2, 0, 1, 2}, cu{0, 1, 3, 6};
  const Ids targets{3, -1, 10, 0, -1, 7};
  const auto inp = as<T>(random_vec(N * C, 121)), w = as<T>(random_vec(C, 122, 0.5, 1.5));
  const auto b = as<T>(random_vec(C, 123)), wo = as<T>(random_vec(OC * C, 124));
  const auto bo = as<T>(random_vec(OC, 125)), qkv = as<T>(random_vec(N * 3 * C, 126, -2, 2));
  const auto wte = as<T>(random_vec(Vp * C, 127)), wpe = as<T>(random_vec(3 * C, 128));
  const auto dout = as<T>(random_vec(N * C, 129)), dout_o = as<T>(random_vec(N * OC, 130));
  const auto logits = as<T>(random_vec(N * Vp, 131, -8, 8));  // exp over a wide range
  const auto x5 = as<T>(random_vec(N * C, 132, -5, 5));
  std::vector<std::pair<const char*, Vec>> outs;
  auto keep = [&](const char* name, const std::vector<T>& v) {
    outs.emplace_back(name, Vec(v.begin(), v.end()));
  };
  std::vector<T> out(N * C), mean(N), rstd(N), o(N * OC), att(attention_att_size(cu.data(), S, NH));
  std::vector<T> d1(N * C), d2(C), d3(OC), dw(OC * C), dqkv(N * 3 * C), datt(att.size());
  std::vector<T> dwte(Vp * C), dwpe(3 * C), losses(N), dlogits(N * Vp);
  encoder_forward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  keep("encoder out", out);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), positions.data(), N, C);
  keep("encoder dwte", dwte), keep("encoder dwpe", dwpe);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  keep("layernorm out", out), keep("layernorm mean", mean), keep("layernorm rstd", rstd);
  std::vector<T> dlw(C), dlb(C);
  layernorm_backward(d1.data(), dlw.data(), dlb.data(), dout.data(), inp.data(), w.data(),
                     mean.data(), rstd.data(), N, C);
  keep("layernorm dinp", d1), keep("layernorm dweight", dlw), keep("layernorm dbias", dlb);
  matmul_forward(o.data(), inp.data(), wo.data(), bo.data(), N, C, OC);
  keep("matmul out", o);
  matmul_forward<T>(o.data(), inp.data(), wo.data(), nullptr, N, C, OC);
  keep("matmul out (no bias)", o);
  matmul_backward(d1.data(), dw.data(), d3.data(), dout_o.data(), inp.data(), wo.data(), N, C, OC);
  keep("matmul dinp", d1), keep("matmul dweight", dw), keep("matmul dbias", d3);
  attention_forward(out.data(), att.data(), qkv.data(), cu.data(), S, C, NH);
  keep("attention out", out), keep("attention att", att);
  attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), cu.data(), S, C,
                     NH);
  keep("attention dqkv", dqkv);
  gelu_forward(out.data(), x5.data(), N * C);
  keep("gelu out", out);
  gelu_backward(d1.data(), x5.data(), dout.data(), N * C);
  keep("gelu dinp", d1);
  residual_forward(out.data(), inp.data(), dout.data(), N * C);
  keep("residual out", out);
  crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
  keep("crossentropy losses", losses);
  crossentropy_backward(dlogits.data(), logits.data(), targets.data(), T(0.25), N, V, Vp);
  keep("crossentropy dlogits", dlogits);
  return outs;
}

TEST(FloatVsDouble, EveryOpAgreesWithinFloatTolerance) {
  const auto f = all_ops<float>(), d = all_ops<double>();
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < f.size(); i++)
    expect_vec(f[i].second, d[i].second, kFp32VsFp64, f[i].first);
}

// ---- threads ----------------------------------------------------------------------------------

TEST(Threads, OversubscriptionIsNamedWithTheThreadsThatFit) {
  // Bound ranks (2 cores each of 8) or unbound ranks that share the host's cores: quiet.
  EXPECT_EQ(oversubscription_warning(4, 2, 2, 8), "");
  EXPECT_EQ(oversubscription_warning(2, 4, 8, 8), "");
  EXPECT_EQ(oversubscription_warning(1, 1, 1, 1), "");
  EXPECT_EQ(oversubscription_warning(4, 1, 2, 2), "");  // --oversubscribe: one thread is the least
  // Unbound (`--bind-to none`): every rank sees all 2 cores and takes 2 threads.
  std::string w = oversubscription_warning(2, 2, 2, 2);
  EXPECT_NE(w.find("2 ranks on this host run 2 OpenMP threads each, 4 threads on its 2 cores"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("`mpirun -x OMP_NUM_THREADS=1`"), std::string::npos) << w;
  EXPECT_NE(w.find("--map-by slot:PE=1"), std::string::npos) << w;
  // Bound to one core each, OMP_NUM_THREADS=4.
  w = oversubscription_warning(8, 4, 1, 8);
  EXPECT_NE(w.find("each rank runs 4 OpenMP threads on the 1 core(s) it may use"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("OMP_NUM_THREADS=1`"), std::string::npos) << w;
  // More ranks than cores: one thread each is the least there is.
  EXPECT_NE(oversubscription_warning(4, 2, 2, 2).find("OMP_NUM_THREADS=1`"), std::string::npos);
  EXPECT_GE(affinity_cores(), 1);
  EXPECT_LE(affinity_cores(), online_cores());
}

}  // namespace
}  // namespace berth::test
