// Every Backend op against the CPU reference (kernels/ops.h), on the backend under test:
//   - test_backend (label cpu): "host-items", the CUDA backend's op wiring (item_backend.h) and
//     kernel bodies (thread_bodies.h a work item at a time; row_bodies.h and flash_bodies.h a
//     block at a time, played by one thread or, in the SIMT tests, a host thread per GPU thread)
//     run on the host, so the CUDA backend's indexing, masking and accumulation are checked on
//     any machine;
//   - test_backend_gpu (label gpu, BERTH_TEST_CUDA): the CUDA backend itself, on a GPU; without
//     one every test skips and says why.
// Plus the CPU backend's memory accounting and the factory's errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "runtime/core/check.h"
#include "tests/eager_attention.h"
#include "tests/expect_error.h"
#include "tests/host_items_backend.h"
#include "tests/tolerance.h"

namespace berth {
namespace {

using test::bf16_round;
using test::EagerAttention;
using test::expect_close;
using test::expect_within_twice_naive;
using test::identity;
using test::rel_l2;
using test::third;
using test::Tol;

std::unique_ptr<Backend> backend_under_test(std::string* why_not) {
#if BERTH_TEST_CUDA
  if (!cuda_built()) {
    *why_not = "this berth was built without CUDA";
    return nullptr;
  }
  try {
    return make_backend("cuda", 0);
  } catch (const Error& e) {
    *why_not = e.what();
    return nullptr;
  }
#else
  (void)why_not;
  return test::make_host_items_backend();
#endif
}

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Documents of 17, 31 and 11 tokens (a packed row: attention never crosses them).
const std::vector<int32_t> kCu = {0, 17, 48, 59};

// The bf16 attention checks' data. Varlen: packed documents of 100, 1, 129 and 70 tokens, which
// cross the 64-token tiles. Ring blocks: 70 queries, of sequence 0 from position 80 and of
// sequence 1 from 0, and a key block of 90 tokens: sequence 0 at positions 0..118 (every other
// one), then sequence 2, which no query has.
const std::vector<int32_t> kTileDocs = {0, 100, 101, 230, 300};
constexpr int kRingQueries = 70, kRingKeys = 90;
struct RingPlaces {
  std::vector<int32_t> q_seq, q_pos, k_seq, k_pos;
};
RingPlaces ring_places() {
  RingPlaces r{std::vector<int32_t>(kRingQueries), std::vector<int32_t>(kRingQueries),
               std::vector<int32_t>(kRingKeys), std::vector<int32_t>(kRingKeys)};
  for (size_t i = 0; i < size_t(kRingQueries); ++i)
    r.q_seq[i] = i < 45 ? 0 : 1, r.q_pos[i] = i < 45 ? int32_t(80 + i) : int32_t(i - 45);
  for (size_t j = 0; j < size_t(kRingKeys); ++j)
    r.k_seq[j] = j < 60 ? 0 : 2, r.k_pos[j] = j < 60 ? int32_t(2 * j) : int32_t(j);
  return r;
}
// Their inputs at width C: the varlen qkv (kTileDocs' tokens) and output gradient; the ring's
// queries, key block 1 (k1, v1), the queries' own keys and values (k2, v2) and output gradient.
struct Bf16Inputs {
  std::vector<float> qkv, dout, q, k1, v1, k2, v2, ring_dout;
};
Bf16Inputs bf16_inputs(int C) {
  const size_t N = size_t(kTileDocs.back()), nq = kRingQueries, n1 = kRingKeys, c = size_t(C);
  return {randn(N * 3 * c, 50, 1.5f), randn(N * c, 51),  randn(nq * c, 60, 1.5f),
          randn(n1 * c, 61, 1.5f),    randn(n1 * c, 62), randn(nq * c, 63, 1.5f),
          randn(nq * c, 64),          randn(nq * c, 65)};
}
constexpr int kN = 59, kS = 3;

class BackendOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    be_ = backend_under_test(&why);
    if (!be_) GTEST_SKIP() << "no backend to test: " << why;
  }
  template <typename T>
  DeviceBuffer<T> up(const std::vector<T>& h) {
    DeviceBuffer<T> d(*be_, int64_t(h.size()));
    be_->upload(d.data(), h.data(), d.bytes());
    return d;
  }
  template <typename T>
  std::vector<T> down(const DeviceBuffer<T>& d) {
    std::vector<T> h(size_t(d.size()));
    be_->download(h.data(), d.data(), d.bytes());
    return h;
  }
  void check(const DeviceBuffer<float>& got, const std::vector<float>& ref, const char* what,
             Tol tol = test::kBackendF32) {
    const auto g = as_double(down(got)), r = as_double(ref);
    ASSERT_EQ(g.size(), r.size()) << what;
    expect_close(g.data(), r.data(), int64_t(g.size()), tol, what);
  }
  struct MatmulRef {
    std::vector<float> out, dinp, dweight, dbias;  // dweight, dbias accumulate onto 0.5
  };
  // The backend's matmul_forward + matmul_backward (in its current precision) of the rows of `inp`
  // against `ref`;
  // the inputs must come back unchanged.
  void check_matmul(const std::vector<float>& inp, const std::vector<float>& w,
                    const std::vector<float>& b, const std::vector<float>& dout, int IC, int OC,
                    const MatmulRef& ref, const std::string& what) {
    const int N = int(inp.size() / size_t(IC));
    auto d_inp = up(inp), d_w = up(w), d_b = up(b), d_dout = up(dout);
    DeviceBuffer<float> d_out(*be_, int64_t(N) * OC), d_dinp(*be_, int64_t(N) * IC);
    auto d_dw = up(std::vector<float>(w.size(), 0.5f)), d_db = up(std::vector<float>(OC, 0.5f));
    be_->matmul_forward(d_out.data(), d_inp.data(), d_w.data(), d_b.data(), N, IC, OC);
    be_->matmul_backward(d_dinp.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(),
                         d_w.data(), N, IC, OC);
    check(d_out, ref.out, (what + " out").c_str());
    check(d_dinp, ref.dinp, (what + " dinp").c_str());
    check(d_dw, ref.dweight, (what + " dweight (+=)").c_str());
    check(d_db, ref.dbias, (what + " dbias (+=, from the fp32 dout)").c_str());
    EXPECT_EQ(down(d_inp), inp) << what << ": inputs are left as they were";
    EXPECT_EQ(down(d_w), w) << what << ": inputs are left as they were";
    EXPECT_EQ(down(d_dout), dout) << what << ": inputs are left as they were";
  }
  // Ring attention's pieces on the backend: q (placed by q_seq, q_pos) against block 1 (k1, v1
  // placed by k_seq, k_pos) and against its own tokens (k2, v2), merged by LSE, then both block
  // backwards, dq, dk and dv accumulating onto `start`. out1 and lse1 are block 1's alone.
  struct RingBlocks {
    std::vector<float> out1, lse1, out, lse, dq, dk1, dv1, dk2, dv2;
  };
  RingBlocks ring_blocks(const std::vector<float>& q, const std::vector<float>& k1,
                         const std::vector<float>& v1, const std::vector<float>& k2,
                         const std::vector<float>& v2, const std::vector<float>& dout,
                         const std::vector<int32_t>& q_seq, const std::vector<int32_t>& q_pos,
                         const std::vector<int32_t>& k_seq, const std::vector<int32_t>& k_pos,
                         int C, int NH, float start) {
    const int nq = int(q_seq.size()), n1 = int(k_seq.size());
    auto d_q = up(q), d_k1 = up(k1), d_v1 = up(v1), d_k2 = up(k2), d_v2 = up(v2), d_do = up(dout);
    auto d_qs = up(q_seq), d_qp = up(q_pos), d_ks = up(k_seq), d_kp = up(k_pos);
    DeviceBuffer<float> d_out(*be_, nq * C), d_lse(*be_, nq * NH), d_ob(*be_, nq * C),
        d_lb(*be_, nq * NH);
    RingBlocks r;
    be_->attention_block_forward(d_out.data(), d_lse.data(), d_q.data(), d_k1.data(), d_v1.data(),
                                 d_qs.data(), d_qp.data(), d_ks.data(), d_kp.data(), nq, n1, C, NH);
    r.out1 = down(d_out), r.lse1 = down(d_lse);
    be_->attention_block_forward(d_ob.data(), d_lb.data(), d_q.data(), d_k2.data(), d_v2.data(),
                                 d_qs.data(), d_qp.data(), d_qs.data(), d_qp.data(), nq, nq, C, NH);
    be_->attention_lse_merge(d_out.data(), d_lse.data(), d_ob.data(), d_lb.data(), nq, C, NH);
    auto filled = [&](size_t n) { return up(std::vector<float>(n, start)); };
    auto d_dq = filled(q.size()), d_dk1 = filled(k1.size()), d_dv1 = filled(k1.size()),
         d_dk2 = filled(k2.size()), d_dv2 = filled(k2.size());
    be_->attention_block_backward(d_dq.data(), d_dk1.data(), d_dv1.data(), d_do.data(),
                                  d_out.data(), d_lse.data(), d_q.data(), d_k1.data(), d_v1.data(),
                                  d_qs.data(), d_qp.data(), d_ks.data(), d_kp.data(), nq, n1, C,
                                  NH);
    be_->attention_block_backward(d_dq.data(), d_dk2.data(), d_dv2.data(), d_do.data(),
                                  d_out.data(), d_lse.data(), d_q.data(), d_k2.data(), d_v2.data(),
                                  d_qs.data(), d_qp.data(), d_qs.data(), d_qp.data(), nq, nq, C,
                                  NH);
    r.out = down(d_out), r.lse = down(d_lse), r.dq = down(d_dq);
    r.dk1 = down(d_dk1), r.dv1 = down(d_dv1), r.dk2 = down(d_dk2), r.dv2 = down(d_dv2);
    return r;
  }
  // The row reductions (kernels/cuda/row_bodies.h on the CUDA backend) against the CPU reference.
  // layernorm forward and backward of N rows of C channels; dinp, dweight, dbias accumulate.
  void check_layernorm(int N, int C) {
    const auto inp = randn(size_t(N) * C, 4), w = randn(size_t(C), 5), b = randn(size_t(C), 6);
    const auto dout = randn(size_t(N) * C, 7);
    std::vector<float> out(inp.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
        dinp(inp.size(), 0.1f), dw(size_t(C), 0.2f), db(size_t(C), 0.3f);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                           C);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                            mean.data(), rstd.data(), N, C);
    auto d_inp = up(inp), d_w = up(w), d_b = up(b), d_dout = up(dout);
    DeviceBuffer<float> d_out(*be_, int64_t(N) * C), d_mean(*be_, N), d_rstd(*be_, N);
    auto d_dinp = up(std::vector<float>(inp.size(), 0.1f));
    auto d_dw = up(std::vector<float>(size_t(C), 0.2f)),
         d_db = up(std::vector<float>(size_t(C), 0.3f));
    be_->layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_inp.data(), d_w.data(),
                           d_b.data(), N, C);
    be_->layernorm_backward(d_dinp.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(),
                            d_w.data(), d_mean.data(), d_rstd.data(), N, C);
    check(d_out, out, "layernorm out");
    check(d_mean, mean, "layernorm mean");
    check(d_rstd, rstd, "layernorm rstd");
    check(d_dinp, dinp, "layernorm dinp (+=)");
    check(d_dw, dw, "layernorm dweight (+=)");
    check(d_db, db, "layernorm dbias (+=)");
  }
  // Logits all below 0 (a max seeded with 0 instead of −inf shows), outputs filled with NaN first
  // (one a kernel leaves unwritten, such as an ignored row's loss, shows).
  static std::vector<float> shifted(std::vector<float> v, float by) {
    for (float& x : v) x += by;
    return v;
  }
  DeviceBuffer<float> nans(int64_t n) {
    DeviceBuffer<float> d(*be_, n);
    be_->fill(d.data(), n, std::nanf(""));
    return d;
  }
  // Targets: every fifth ignored (−1), the others spread over the vocabulary.
  static std::vector<int32_t> ce_targets(int N, int V) {
    std::vector<int32_t> t(static_cast<size_t>(N));
    for (int n = 0; n < N; ++n)
      t[size_t(n)] = n % 5 == 4 ? -1 : int32_t((int64_t(n) * 7919 + 11) % V);
    return t;
  }
  // Cross-entropy over V real columns of rows Vp wide, the backward in place.
  void check_crossentropy(int N, int V, int Vp) {
    const auto logits = shifted(randn(size_t(N) * Vp, 23, 2.0f), -20.0f);
    const auto targets = ce_targets(N, V);
    std::vector<float> losses(static_cast<size_t>(N)), dl(logits.size());
    const float dloss = 1.0f / 47;
    cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
    cpu::crossentropy_backward(dl.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    auto d_logits = up(logits);
    auto d_t = up(targets);
    DeviceBuffer<float> d_losses = nans(N);
    be_->crossentropy_forward(d_losses.data(), d_logits.data(), d_t.data(), N, V, Vp);
    be_->crossentropy_backward(d_logits.data(), d_logits.data(), d_t.data(), dloss, N, V, Vp);
    check(d_losses, losses, "cross-entropy losses");
    check(d_logits, dl, "cross-entropy dlogits (in place)");
  }
  // The three steps of the vocabulary-parallel cross-entropy on the shard [off, off + Vpl) of a
  // vocabulary of off + real (real ≤ Vpl columns of it real), the backward in place.
  void check_vocab_crossentropy(int N, int Vpl, int off, int real) {
    const auto logits = shifted(randn(size_t(N) * Vpl, 33, 2.0f), -20.0f);
    const auto targets = ce_targets(N, off + real);
    std::vector<float> mx(static_cast<size_t>(N)), st(2 * size_t(N)),
        losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)), dl(logits.size());
    cpu::vocab_ce_max(mx.data(), logits.data(), N, real, Vpl);
    cpu::vocab_ce_partials(st.data(), logits.data(), mx.data(), targets.data(), N, real, Vpl, off);
    cpu::vocab_ce_finish(losses.data(), lse.data(), mx.data(), st.data(), targets.data(), N);
    cpu::vocab_ce_backward(dl.data(), logits.data(), lse.data(), targets.data(), 0.25f, N, real,
                           Vpl, off);
    auto d_logits = up(logits);
    auto d_t = up(targets);
    DeviceBuffer<float> d_mx = nans(N), d_st = nans(2 * int64_t(N)), d_losses = nans(N),
                        d_lse = nans(N);
    be_->vocab_ce_max(d_mx.data(), d_logits.data(), N, real, Vpl);
    be_->vocab_ce_partials(d_st.data(), d_logits.data(), d_mx.data(), d_t.data(), N, real, Vpl,
                           off);
    be_->vocab_ce_finish(d_losses.data(), d_lse.data(), d_mx.data(), d_st.data(), d_t.data(), N);
    be_->vocab_ce_backward(d_logits.data(), d_logits.data(), d_lse.data(), d_t.data(), 0.25f, N,
                           real, Vpl, off);
    check(d_mx, mx, "vocab ce max");
    check(d_st, st, "vocab ce partials");
    check(d_losses, losses, "vocab ce losses");
    check(d_lse, lse, "vocab ce lse");
    check(d_logits, dl, "vocab ce dlogits (in place)");
  }
  void check_sum_squares(const std::vector<float>& x) {
    auto d_x = up(x);
    const int64_t n = int64_t(x.size());
    const double ref = cpu::sum_squares(x.data(), n), got = be_->sum_squares(d_x.data(), n);
    EXPECT_NEAR(got, ref, 1e-12 * ref) << n << " values";
  }

  // The bf16 attention checks below, at these head counts (C = 128).
  void check_bf16_varlen(int C, const std::vector<int>& head_counts);
  void check_bf16_ring_blocks(int C, const std::vector<int>& head_counts);
  std::unique_ptr<Backend> be_;
};

TEST_F(BackendOps, EncoderForwardAndBackward) {
  const int C = 32, Vp = 64, maxT = 64;
  std::vector<int32_t> tok(kN), pos(kN);
  for (int n = 0; n < kN; ++n) tok[size_t(n)] = (n * 7) % Vp, pos[size_t(n)] = n % 31;
  const auto wte = randn(size_t(Vp) * C, 1), wpe = randn(size_t(maxT) * C, 2);
  const auto dout = randn(size_t(kN) * C, 3);
  std::vector<float> out(size_t(kN) * C), dwte(wte.size(), 0.5f), dwpe(wpe.size(), 0.25f);
  cpu::encoder_forward(out.data(), tok.data(), pos.data(), wte.data(), wpe.data(), kN, C);
  auto d_tok = up(tok), d_pos = up(pos);
  auto d_wte = up(wte), d_wpe = up(wpe), d_dout = up(dout);
  DeviceBuffer<float> d_out(*be_, kN * C);
  auto d_dwte = up(dwte), d_dwpe = up(dwpe);  // accumulates into what is there
  be_->encoder_forward(d_out.data(), d_tok.data(), d_pos.data(), d_wte.data(), d_wpe.data(), kN, C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), pos.data(), kN, C);
  be_->encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.data(), d_pos.data(), kN,
                        C);
  check(d_out, out, "encoder out");
  check(d_dwte, dwte, "encoder dwte");
  check(d_dwpe, dwpe, "encoder dwpe");
}

TEST_F(BackendOps, LayerNormForwardAndBackward) { check_layernorm(kN, 48); }

// 59 rows, and 150: more than one 64-row part of the CUDA backend's bias-gradient sums.
TEST_F(BackendOps, MatmulForwardAndBackward) {
  const int IC = 40, OC = 24;
  for (const int N : {kN, 150}) {
    const auto inp = randn(size_t(N) * IC, 8), w = randn(size_t(OC) * IC, 9), b = randn(OC, 10);
    const auto dout = randn(size_t(N) * OC, 11);
    std::vector<float> out(size_t(N) * OC), dinp(inp.size()), dw(w.size(), 0.5f), db(OC, 0.5f);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                         IC, OC);
    check_matmul(inp, w, b, dout, IC, OC, {out, dinp, dw, db}, fmt::format("matmul, {} rows", N));
  }
}

// bf16 precision: the backend's GEMMs equal the fp32 GEMMs of inputs rounded to bf16 (products
// exact, fp32 accumulation: only the summation order may differ), dbias is summed from the fp32
// gradient, and the result is not the fp32 one (the mode is not a no-op).
TEST_F(BackendOps, Bf16MatmulIsTheFp32GemmOfRoundedInputs) {
  const int IC = 96, OC = 40;
  const auto inp = randn(size_t(kN) * IC, 12), w = randn(size_t(OC) * IC, 13, 0.1f),
             b = randn(OC, 14);
  const auto dout = randn(size_t(kN) * OC, 15);
  auto rounded = [](std::vector<float> v) {
    cpu::round_to_bf16(v.data(), v.data(), int64_t(v.size()));
    return v;
  };
  const auto inp16 = rounded(inp), w16 = rounded(w), dout16 = rounded(dout);
  std::vector<float> out(size_t(kN) * OC), dinp(inp.size()), dw(w.size(), 0.5f), db(OC, 0.5f);
  cpu::matmul_forward(out.data(), inp16.data(), w16.data(), b.data(), kN, IC, OC);
  cpu::matmul_backward<float>(dinp.data(), dw.data(), nullptr, dout16.data(), inp16.data(),
                              w16.data(), kN, IC, OC);
  cpu::matmul_backward<float>(nullptr, nullptr, db.data(), dout.data(), nullptr, nullptr, kN, IC,
                              OC);
  std::vector<float> out32(out.size());
  cpu::matmul_forward(out32.data(), inp.data(), w.data(), b.data(), kN, IC, OC);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(out[i] - out32[i])));
    max_abs = std::max(max_abs, double(std::fabs(out32[i])));
  }
  EXPECT_GT(max_diff, 1e-3 * max_abs) << "bf16 rounding must change the GEMM's result";

  be_->set_matmul_precision(MatmulPrecision::kBf16);
  check_matmul(inp, w, b, dout, IC, OC, {out, dinp, dw, db}, "bf16 matmul");
}

// The MLP's first layer, pre = inp·Wᵀ + b and out = gelu(pre), in one call (the CUDA backend:
// cuBLASLt with the bias epilogue, in bf16 with GELU_AUX_BIAS, where it takes the call, and the
// unfused GEMM, bias and gelu where a pointer is not 16-byte aligned, as the bias at an odd
// offset here), in both precisions, against the CPU's matmul_forward then gelu_forward. bf16's
// GELU is cuBLASLt's: kCublasLtGelu.
TEST_F(BackendOps, MatmulGeluForwardIsTheMatmulThenGelu) {
  const int IC = 48, OC = 32;
  const auto inp = randn(size_t(kN) * IC, 16), w = randn(size_t(OC) * IC, 17, 0.2f);
  auto bias_buf = randn(size_t(OC) + 1, 18);
  for (MatmulPrecision p : {MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
    for (int offset : {0, 1}) {
      SCOPED_TRACE(std::string(matmul_precision_name(p)) + (offset ? ", unaligned bias" : ""));
      auto rounded = [&](std::vector<float> v) {
        if (p == MatmulPrecision::kBf16) cpu::round_to_bf16(v.data(), v.data(), int64_t(v.size()));
        return v;
      };
      const std::vector<float> b(bias_buf.begin() + offset, bias_buf.begin() + offset + OC);
      std::vector<float> pre(size_t(kN) * OC), out(pre.size());
      cpu::matmul_forward(pre.data(), rounded(inp).data(), rounded(w).data(), b.data(), kN, IC, OC);
      cpu::gelu_forward(out.data(), pre.data(), int64_t(pre.size()));
      be_->set_matmul_precision(p);
      auto d_inp = up(inp), d_w = up(w), d_b = up(bias_buf);
      DeviceBuffer<float> d_pre(*be_, int64_t(kN) * OC), d_out(*be_, int64_t(kN) * OC);
      be_->matmul_gelu_forward(d_out.data(), d_pre.data(), d_inp.data(), d_w.data(),
                               d_b.data() + offset, kN, IC, OC);
      check(d_pre, pre, "pre-activation");
      check(d_out, out, "gelu output",
            p == MatmulPrecision::kBf16 ? test::kCublasLtGelu : test::kBackendF32);
    }
  }
}

// The MLP's second layer backward with the GELU's derivative: dweight and dbias accumulate
// (onto 0.5) from the saved gelu output and dout, and dpre = (dout·W) ⊙ gelu'(pre) is
// overwritten; in bf16 the GEMM operands are rounded, as matmul_backward rounds them.
TEST_F(BackendOps, GeluMatmulBackwardIsTheMatmulBackwardThenGeluBackward) {
  const int IC = 64, OC = 24;
  const auto pre = randn(size_t(kN) * IC, 30), w = randn(size_t(OC) * IC, 31, 0.2f),
             dout = randn(size_t(kN) * OC, 32);
  std::vector<float> inp(pre.size());
  cpu::gelu_forward(inp.data(), pre.data(), int64_t(inp.size()));
  for (MatmulPrecision p : {MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
    SCOPED_TRACE(matmul_precision_name(p));
    auto rounded = [&](std::vector<float> v) {
      if (p == MatmulPrecision::kBf16) cpu::round_to_bf16(v.data(), v.data(), int64_t(v.size()));
      return v;
    };
    std::vector<float> dpre(pre.size()), dw(w.size(), 0.5f), db(size_t(OC), 0.5f);
    const auto rd = rounded(dout);
    cpu::matmul_backward(dpre.data(), dw.data(), static_cast<float*>(nullptr), rd.data(),
                         rounded(inp).data(), rounded(w).data(), kN, IC, OC);
    cpu::matmul_backward(static_cast<float*>(nullptr), static_cast<float*>(nullptr), db.data(),
                         dout.data(), inp.data(), w.data(), kN, IC, OC);  // bias: fp32 dout
    cpu::gelu_backward(dpre.data(), pre.data(), dpre.data(), int64_t(dpre.size()));
    be_->set_matmul_precision(p);
    auto d_pre = up(pre), d_inp = up(inp), d_w = up(w), d_dout = up(dout);
    auto d_dpre = up(std::vector<float>(pre.size(), 7.0f)),
         d_dw = up(std::vector<float>(w.size(), 0.5f)), d_db = up(std::vector<float>(OC, 0.5f));
    be_->gelu_matmul_backward(d_dpre.data(), d_dw.data(), d_db.data(), d_dout.data(), d_inp.data(),
                              d_w.data(), d_pre.data(), kN, IC, OC);
    check(d_dpre, dpre, "dpre (overwritten)",
          p == MatmulPrecision::kBf16 ? test::kCublasLtDgelu : test::kBackendF32);
    check(d_dw, dw, "dweight (+=)");
    check(d_db, db, "dbias (+=)");
    EXPECT_EQ(down(d_pre), pre) << "inputs are left as they were";
  }
}

TEST_F(BackendOps, PackedCausalAttentionForwardAndBackward) {
  for (int NH : {4, 1}) {  // head sizes 16 and 64
    const int C = 64;
    SCOPED_TRACE(NH);
    const auto qkv = randn(size_t(kN) * 3 * C, 12), dout = randn(size_t(kN) * C, 13);
    const int64_t att_n = cpu::attention_att_size(kCu.data(), kS, NH);
    const size_t na = static_cast<size_t>(att_n);
    std::vector<float> out(size_t(kN) * C), att(na), dqkv(qkv.size()), datt(na);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), kCu.data(), kS, C, NH);
    cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                            kCu.data(), kS, C, NH);
    auto d_qkv = up(qkv), d_dout = up(dout);
    auto d_cu = up(kCu);
    DeviceBuffer<float> d_out(*be_, kN * C), d_att(*be_, att_n), d_dqkv(*be_, kN * 3 * C),
        d_datt(*be_, att_n);
    be_->attention_forward(d_out.data(), d_att.data(), d_qkv.data(), d_cu.data(), kCu.data(), kS, C,
                           NH);
    be_->attention_backward(d_dqkv.data(), d_datt.data(), d_dout.data(), d_qkv.data(), d_att.data(),
                            d_cu.data(), kCu.data(), kS, C, NH);
    check(d_out, out, "attention out");
    check(d_att, att, "attention probabilities");
    check(d_dqkv, dqkv, "attention dqkv");
  }
}

// The flash-style varlen attention (online softmax, LSE kept) against the probabilities kernels,
// on packed documents of 17, 31 and 11 tokens, head sizes 64 and 128: the CPU reference first,
// then the backend's against it.
TEST_F(BackendOps, FlashStyleVarlenAttentionEqualsTheProbabilitiesKernels) {
  for (int NH : {2, 1}) {
    const int C = 128;
    SCOPED_TRACE(NH);
    const auto qkv = randn(size_t(kN) * 3 * C, 40), dout = randn(size_t(kN) * C, 41);
    const size_t na = static_cast<size_t>(cpu::attention_att_size(kCu.data(), kS, NH));
    std::vector<float> out(size_t(kN) * C), att(na), dqkv(qkv.size()), datt(na);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), kCu.data(), kS, C, NH);
    cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                            kCu.data(), kS, C, NH);
    std::vector<float> fo(out.size()), lse(size_t(kN) * NH), fd(qkv.size());
    cpu::attention_varlen_forward(fo.data(), lse.data(), qkv.data(), kCu.data(), kS, C, NH);
    cpu::attention_varlen_backward(fd.data(), dout.data(), fo.data(), lse.data(), qkv.data(),
                                   kCu.data(), kS, C, NH);
    {
      const auto a = as_double(fo), b = as_double(out), c = as_double(fd), d = as_double(dqkv);
      expect_close(a.data(), b.data(), int64_t(a.size()), test::kBackendF32, "cpu varlen out");
      expect_close(c.data(), d.data(), int64_t(c.size()), test::kBackendF32, "cpu varlen dqkv");
    }
    auto d_qkv = up(qkv), d_dout = up(dout);
    auto d_cu = up(kCu);
    DeviceBuffer<float> d_out(*be_, kN * C), d_lse(*be_, kN * NH), d_dqkv(*be_, kN * 3 * C);
    be_->attention_varlen_forward(d_out.data(), d_lse.data(), d_qkv.data(), d_cu.data(),
                                  kCu.data(), kS, C, NH);
    be_->attention_varlen_backward(d_dqkv.data(), d_dout.data(), d_out.data(), d_lse.data(),
                                   d_qkv.data(), d_cu.data(), kCu.data(), kS, C, NH);
    check(d_out, fo, "varlen out");
    check(d_lse, lse, "varlen lse");
    check(d_dqkv, fd, "varlen dqkv");
  }
}

// Whether the backend runs bf16 attention at this head size on tensor cores; says so if not.
bool on_tensor_cores(Backend& be, int head_size) {
  if (be.attention_on_tensor_cores(head_size)) return true;
#if !BERTH_TEST_CUDA
  ADD_FAILURE() << "the host executor takes every head size these kernels support";
#endif
  std::printf("bf16 attention HS=%d: not on tensor cores on %s (shared memory), not checked\n",
              head_size, be.name().c_str());
  return false;
}

// bf16 precision: the varlen attention (the tiled tensor-core kernels on the CUDA backend,
// kernels/cuda/flash_bodies.h, run block by block on the host in test_backend) against the fp64
// reference, within twice the error of the naive bf16 implementation. Packed documents of 100,
// 1, 129 and 70 tokens cross the 64-token tiles; head sizes 32, 64, 80, 96 and 128.
void BackendOps::check_bf16_varlen(int C, const std::vector<int>& head_counts) {
  const std::vector<int32_t>& cu = kTileDocs;
  const int N = cu.back(), S = int(cu.size()) - 1;
  std::vector<int> doc(static_cast<size_t>(N));
  for (int s = 0; s < S; ++s)
    for (int t = cu[size_t(s)]; t < cu[size_t(s) + 1]; ++t) doc[size_t(t)] = s;
  auto sees = [&](int i, int j) { return doc[size_t(i)] == doc[size_t(j)] && j <= i; };
  be_->set_matmul_precision(MatmulPrecision::kBf16);
  for (int NH : head_counts) {
    SCOPED_TRACE(NH);
    if (!on_tensor_cores(*be_, C / NH)) continue;  // e.g. head size 80 on sm_86/89
    const Bf16Inputs in = bf16_inputs(C);
    const std::vector<float>&qkv = in.qkv, &dout = in.dout;
    const auto q = third(qkv, C, 0), k = third(qkv, C, 1), v = third(qkv, C, 2);
    const EagerAttention ref = test::eager_attention(q, k, v, dout, C, NH, sees, identity);
    const EagerAttention naive = test::eager_attention(q, k, v, dout, C, NH, sees, bf16_round);
    {  // the oracle itself against the CPU reference kernels
      std::vector<double> out(size_t(N) * C), dqkv(qkv.size());
      const size_t na = size_t(cpu::attention_att_size(cu.data(), S, NH));
      std::vector<double> att(na), datt(na);
      const std::vector<double> q64 = as_double(qkv), d64 = as_double(dout);
      cpu::attention_forward(out.data(), att.data(), q64.data(), cu.data(), S, C, NH);
      cpu::attention_backward(dqkv.data(), datt.data(), d64.data(), q64.data(), att.data(),
                              cu.data(), S, C, NH);
      ASSERT_LT(rel_l2(ref.out, out), 1e-12);
      ASSERT_LT(rel_l2(ref.dq, third(dqkv, C, 0)), 1e-12);
      ASSERT_LT(rel_l2(ref.dk, third(dqkv, C, 1)), 1e-12);
    }
    auto d_qkv = up(qkv), d_dout = up(dout);
    auto d_cu = up(cu);
    DeviceBuffer<float> d_out(*be_, int64_t(N) * C), d_lse(*be_, int64_t(N) * NH),
        d_dqkv(*be_, int64_t(N) * 3 * C);
    be_->attention_varlen_forward(d_out.data(), d_lse.data(), d_qkv.data(), d_cu.data(), cu.data(),
                                  S, C, NH);
    be_->attention_varlen_backward(d_dqkv.data(), d_dout.data(), d_out.data(), d_lse.data(),
                                   d_qkv.data(), d_cu.data(), cu.data(), S, C, NH);
    const auto dqkv = as_double(down(d_dqkv));
    const EagerAttention got{as_double(down(d_out)), as_double(down(d_lse)), third(dqkv, C, 0),
                             third(dqkv, C, 1), third(dqkv, C, 2)};
    expect_within_twice_naive(got, ref, naive, "bf16 attention HS=" + std::to_string(C / NH));
  }
  be_->set_matmul_precision(MatmulPrecision::kFp32);
}
TEST_F(BackendOps, Bf16AttentionIsWithinTwiceTheErrorOfANaiveBf16Implementation) {
  check_bf16_varlen(128, {4, 2, 1});
  check_bf16_varlen(160, {2});  // head size 80
  check_bf16_varlen(192, {2});  // 96
}

// bf16 precision, ring attention's pieces (on the CUDA backend the tiled tensor-core kernels
// over placed tokens): 70 queries of two sequences against two key blocks, one holding the
// queries' own tokens and one with earlier positions of sequence 0 and tokens of a sequence no
// query has (so some queries see nothing in it: LSE −inf, out 0), merged by LSE in fp32, then the
// block backwards. Against the fp64 reference over both blocks' keys, within twice the error of
// the naive bf16 implementation; head sizes 32, 64, 80, 96 and 128.
void BackendOps::check_bf16_ring_blocks(int C, const std::vector<int>& head_counts) {
  const int nq = kRingQueries;
  const auto [q_seq, q_pos, k_seq, k_pos] = ring_places();
  // keys: block 1, then the queries' own tokens
  std::vector<int32_t> all_seq = k_seq, all_pos = k_pos;
  all_seq.insert(all_seq.end(), q_seq.begin(), q_seq.end());
  all_pos.insert(all_pos.end(), q_pos.begin(), q_pos.end());
  auto sees = [&](int i, int j) {
    return all_seq[size_t(j)] == q_seq[size_t(i)] && all_pos[size_t(j)] <= q_pos[size_t(i)];
  };
  be_->set_matmul_precision(MatmulPrecision::kBf16);
  for (int NH : head_counts) {
    SCOPED_TRACE(NH);
    if (!on_tensor_cores(*be_, C / NH)) continue;
    const Bf16Inputs in = bf16_inputs(C);
    const std::vector<float>&q = in.q, &k1 = in.k1, &v1 = in.v1, &k2 = in.k2, &v2 = in.v2,
          &dout = in.ring_dout;
    std::vector<float> k = k1, v = v1;
    k.insert(k.end(), k2.begin(), k2.end()), v.insert(v.end(), v2.begin(), v2.end());
    const EagerAttention ref = test::eager_attention(q, k, v, dout, C, NH, sees, identity);
    const EagerAttention naive = test::eager_attention(q, k, v, dout, C, NH, sees, bf16_round);

    const RingBlocks r = ring_blocks(q, k1, v1, k2, v2, dout, q_seq, q_pos, k_seq, k_pos, C, NH,
                                     0.5f);  // dq, dk and dv accumulate (+=) onto 0.5
    // queries of sequence 1 see nothing in block 1
    EXPECT_TRUE(std::isinf(r.lse1[size_t(nq - 1) * NH]) && r.lse1[size_t(nq - 1) * NH] < 0);
    EXPECT_EQ(r.out1[size_t(nq - 1) * C], 0.0f);
    auto less_half = [](const std::vector<float>& a, const std::vector<float>& b = {}) {
      std::vector<double> h(a.begin(), a.end());
      h.insert(h.end(), b.begin(), b.end());
      for (double& x : h) x -= 0.5;
      return h;
    };
    const EagerAttention got{as_double(r.out), as_double(r.lse), less_half(r.dq),
                             less_half(r.dk1, r.dk2), less_half(r.dv1, r.dv2)};
    expect_within_twice_naive(got, ref, naive, "bf16 ring blocks HS=" + std::to_string(C / NH));
  }
  be_->set_matmul_precision(MatmulPrecision::kFp32);
}
TEST_F(BackendOps, Bf16RingAttentionBlocksAreWithinTwiceTheErrorOfANaiveBf16Implementation) {
  check_bf16_ring_blocks(128, {4, 2, 1});
  check_bf16_ring_blocks(160, {2});  // head size 80
  check_bf16_ring_blocks(192, {2});  // 96
}

#if !BERTH_TEST_CUDA
// A device whose shared memory takes a head size's backward only with 32-query tiles (128 on an
// A100: 163 KiB, the 64-query tiles need 191.5; 64 on sm_86/89: 99 KiB, they need 127.5): the
// same two checks there, on the 32-query backward.
TEST_F(BackendOps, Bf16AttentionBackwardWith32QueryTilesIsWithinTwiceANaiveBf16Error) {
  using V = cuda::flash::Varlen;
  struct Case {
    int head_size;
    size_t max_shared;
  };
  for (const Case c : {Case{128, cuda::flash::Backward<128, V, 32>::shared_bytes()},
                       Case{64, cuda::flash::Backward<64, V, 32>::shared_bytes()}}) {
    SCOPED_TRACE(c.head_size);
    be_ = test::make_host_items_backend(false, 0, c.max_shared);
    be_->set_matmul_precision(MatmulPrecision::kBf16);
    const auto* items = dynamic_cast<const cuda::ItemBackend<test::HostExec>*>(be_.get());
    ASSERT_NE(items, nullptr);
    ASSERT_EQ(items->backward_query_tile(c.head_size), 32);
    check_bf16_varlen(c.head_size, {1});
    check_bf16_ring_blocks(c.head_size, {1});
  }
  // Asked for where both fit (BERTH_FLASH_BACKWARD_QUERY_TILE, which bench_gpu_ops times): 32.
  be_ = test::make_host_items_backend(false);
  const auto* items = dynamic_cast<const cuda::ItemBackend<test::HostExec>*>(be_.get());
  ASSERT_NE(items, nullptr);
  EXPECT_EQ(items->backward_query_tile(64), 64);
  ASSERT_EQ(setenv("BERTH_FLASH_BACKWARD_QUERY_TILE", "32", 1), 0);
  EXPECT_EQ(items->backward_query_tile(64), 32);
  ASSERT_EQ(setenv("BERTH_FLASH_BACKWARD_QUERY_TILE", "48", 1), 0);
  EXPECT_EQ(items->backward_query_tile(64), 64) << "only 32 is another choice";
  unsetenv("BERTH_FLASH_BACKWARD_QUERY_TILE");
}

// The tiled bf16 kernels with a host thread per GPU thread and real barriers (SIMT mode,
// kernels/cuda/host_simt.h) against the same kernels played by one thread: bit-identical, since
// each value is computed by the same operations in the same order and only which thread computes
// it changes. A barrier missing between a write to shared memory and another thread's read of it
// lets that read run early, as on a GPU, and shows here as a difference (dropping the __syncwarp
// after the forward's S = Q·Kᵀ does), or under ThreadSanitizer (scripts/race_check) as a race.
// Varlen and ring blocks (and blocks with no key or no query), head sizes 32, 64, 80, 96 and
// 128, and 128 and 64 with the 32-query backward.
TEST_F(BackendOps, TiledBf16AttentionIsTheSameWithEveryThreadOfABlockRunning) {
  using V = cuda::flash::Varlen;
  const std::vector<int32_t>& cu = kTileDocs;
  const int N = cu.back(), S = int(cu.size()) - 1, nq = kRingQueries, n1 = kRingKeys;
  const auto [q_seq, q_pos, k_seq, k_pos] = ring_places();
  struct Case {
    int C, NH;
    size_t max_shared;
  };
  const size_t a100_like = cuda::flash::Backward<128, V, 32>::shared_bytes(),
               sm86_like = cuda::flash::Backward<64, V, 32>::shared_bytes();
  for (const Case c : {Case{128, 4, SIZE_MAX}, Case{128, 2, SIZE_MAX}, Case{128, 1, SIZE_MAX},
                       Case{160, 2, SIZE_MAX}, Case{192, 2, SIZE_MAX}, Case{128, 1, a100_like},
                       Case{64, 1, sm86_like}}) {
    const int C = c.C, NH = c.NH;
    const Bf16Inputs in = bf16_inputs(C);
    const std::vector<float>&qkv = in.qkv, &dout = in.dout, &q = in.q, &k1 = in.k1, &v1 = in.v1,
          &k2 = in.k2, &v2 = in.v2, &ring_dout = in.ring_dout;
    SCOPED_TRACE("head size " + std::to_string(C / NH) +
                 (c.max_shared != SIZE_MAX ? ", 32-query backward" : ""));
    std::vector<std::vector<float>> results[2];  // turn-taking, SIMT
    for (const bool simt : {false, true}) {
      be_ = test::make_host_items_backend(false, 0, c.max_shared, simt);
      be_->set_matmul_precision(MatmulPrecision::kBf16);
      ASSERT_TRUE(be_->attention_on_tensor_cores(C / NH));
      auto d_qkv = up(qkv), d_dout = up(dout);
      auto d_cu = up(cu);
      DeviceBuffer<float> d_out(*be_, int64_t(N) * C), d_lse(*be_, int64_t(N) * NH),
          d_dqkv(*be_, int64_t(N) * 3 * C);
      be_->attention_varlen_forward(d_out.data(), d_lse.data(), d_qkv.data(), d_cu.data(),
                                    cu.data(), S, C, NH);
      be_->attention_varlen_backward(d_dqkv.data(), d_dout.data(), d_out.data(), d_lse.data(),
                                     d_qkv.data(), d_cu.data(), cu.data(), S, C, NH);
      const RingBlocks r =
          ring_blocks(q, k1, v1, k2, v2, ring_dout, q_seq, q_pos, k_seq, k_pos, C, NH, 0.5f);
      // a query block against no keys, and a key block against no queries: the kernels' loops
      // do not run, and what a block set up before them is all its last phase reads
      auto d_q = up(q), d_k1 = up(k1), d_v1 = up(v1);
      auto d_qs = up(q_seq), d_qp = up(q_pos), d_ks = up(k_seq), d_kp = up(k_pos);
      DeviceBuffer<float> d_out0(*be_, nq * C), d_lse0(*be_, nq * NH);
      auto d_dk0 = up(std::vector<float>(k1.size(), 0.5f)),
           d_dv0 = up(std::vector<float>(k1.size(), 0.5f));
      be_->attention_block_forward(d_out0.data(), d_lse0.data(), d_q.data(), nullptr, nullptr,
                                   d_qs.data(), d_qp.data(), nullptr, nullptr, nq, 0, C, NH);
      be_->attention_block_backward(nullptr, d_dk0.data(), d_dv0.data(), nullptr, nullptr, nullptr,
                                    nullptr, d_k1.data(), d_v1.data(), nullptr, nullptr,
                                    d_ks.data(), d_kp.data(), 0, n1, C, NH);
      const auto out0 = down(d_out0), lse0 = down(d_lse0), dk0 = down(d_dk0), dv0 = down(d_dv0);
      EXPECT_TRUE(std::all_of(out0.begin(), out0.end(), [](float x) { return x == 0.0f; }));
      EXPECT_TRUE(std::all_of(lse0.begin(), lse0.end(), [](float x) { return std::isinf(x); }));
      EXPECT_EQ(dk0, std::vector<float>(k1.size(), 0.5f)) << "no query: dK unchanged";
      EXPECT_EQ(dv0, std::vector<float>(k1.size(), 0.5f)) << "no query: dV unchanged";
      results[simt] = {down(d_out), down(d_lse), down(d_dqkv), r.out1, r.lse1, r.out, r.lse,
                       r.dq,        r.dk1,       r.dv1,        r.dk2,  r.dv2,  out0,  lse0};
    }
    const char* names[] = {"varlen out", "varlen lse", "varlen dqkv", "block 1 out", "block 1 lse",
                           "merged out", "merged lse", "ring dq",     "ring dk1",    "ring dv1",
                           "ring dk2",   "ring dv2",   "no-key out",  "no-key lse"};
    for (size_t i = 0; i < results[0].size(); ++i) {
      const auto &a = results[0][i], &b = results[1][i];
      ASSERT_EQ(a.size(), b.size());
      size_t differ = 0;
      for (size_t e = 0; e < a.size(); ++e) differ += std::memcmp(&a[e], &b[e], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << names[i] << ": " << differ << " of " << a.size()
                            << " values differ between one thread and a thread per GPU thread";
    }
  }
}
#endif

// Ring attention's pieces: a query block against two key blocks (sequence ids and global
// positions as cp_shard gives them), merged by LSE, and the block backward.
TEST_F(BackendOps, AttentionBlocksAndLseMerge) {
  for (int NH : {2, 1}) {  // head sizes 64 and 128
    const int C = 128, nq = 40, nk = 36;
    SCOPED_TRACE(NH);
    std::vector<int32_t> q_seq(nq), q_pos(nq), k_seq(nk), k_pos(nk);
    for (int i = 0; i < nq; ++i)
      q_seq[size_t(i)] = i < 25 ? 0 : 1, q_pos[size_t(i)] = i < 25 ? 10 + i : i - 25;
    for (int j = 0; j < nk; ++j)
      k_seq[size_t(j)] = j < 20 ? 0 : 2, k_pos[size_t(j)] = j < 20 ? 2 * j : j;
    const auto q = randn(size_t(nq) * C, 14), k1 = randn(size_t(nk) * C, 15),
               v1 = randn(size_t(nk) * C, 16), k2 = randn(size_t(nq) * C, 17),
               v2 = randn(size_t(nq) * C, 18), dout = randn(size_t(nq) * C, 19);
    // reference: block 1 (some queries see nothing: lse −inf), then the queries' own block;
    // the gradients accumulate onto 0.5
    std::vector<float> out(size_t(nq) * C), lse(size_t(nq) * NH), ob(out.size()), lb(lse.size());
    cpu::attention_block_forward(out.data(), lse.data(), q.data(), k1.data(), v1.data(),
                                 q_seq.data(), q_pos.data(), k_seq.data(), k_pos.data(), nq, nk, C,
                                 NH);
    const std::vector<float> out1 = out, lse1 = lse;
    cpu::attention_block_forward(ob.data(), lb.data(), q.data(), k2.data(), v2.data(), q_seq.data(),
                                 q_pos.data(), q_seq.data(), q_pos.data(), nq, nq, C, NH);
    cpu::attention_lse_merge(out.data(), lse.data(), ob.data(), lb.data(), nq, C, NH);
    std::vector<float> dq(out.size(), 0.5f), dk1(size_t(nk) * C, 0.5f), dv1(dk1.size(), 0.5f),
        dk2(out.size(), 0.5f), dv2(out.size(), 0.5f);
    cpu::attention_block_backward(dq.data(), dk1.data(), dv1.data(), dout.data(), out.data(),
                                  lse.data(), q.data(), k1.data(), v1.data(), q_seq.data(),
                                  q_pos.data(), k_seq.data(), k_pos.data(), nq, nk, C, NH);
    cpu::attention_block_backward(dq.data(), dk2.data(), dv2.data(), dout.data(), out.data(),
                                  lse.data(), q.data(), k2.data(), v2.data(), q_seq.data(),
                                  q_pos.data(), q_seq.data(), q_pos.data(), nq, nq, C, NH);
    const RingBlocks r =
        ring_blocks(q, k1, v1, k2, v2, dout, q_seq, q_pos, k_seq, k_pos, C, NH, 0.5f);
    // lse: −inf where a query sees no key of a block is compared as equal
    auto check_lse = [](const std::vector<float>& got, const std::vector<float>& want,
                        const char* what) {
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isinf(want[i])) {
          EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << " " << i;
        } else {
          EXPECT_NEAR(got[i], want[i],
                      test::kBackendF32.atol + test::kBackendF32.rtol * std::fabs(want[i]))
              << what << " " << i;
        }
      }
    };
    check_lse(r.lse1, lse1, "block 1 lse");
    check_lse(r.lse, lse, "merged lse");
    const struct {
      const std::vector<float>& got;
      const std::vector<float>& want;
      const char* what;
    } pairs[] = {{r.out1, out1, "ring block 1 out"},   {r.out, out, "ring block out (merged)"},
                 {r.dq, dq, "ring block dq (+=)"},     {r.dk1, dk1, "ring block 1 dk (+=)"},
                 {r.dv1, dv1, "ring block 1 dv (+=)"}, {r.dk2, dk2, "ring block 2 dk (+=)"},
                 {r.dv2, dv2, "ring block 2 dv (+=)"}};
    for (const auto& p : pairs) {
      const auto g = as_double(p.got), w = as_double(p.want);
      expect_close(g.data(), w.data(), int64_t(w.size()), test::kBackendF32, p.what);
    }
  }
}

TEST_F(BackendOps, ElementwiseOps) {
  const int64_t n = 1000;
  const auto x = randn(size_t(n), 20, 2.0f), y = randn(size_t(n), 21), d = randn(size_t(n), 22);
  std::vector<float> g(x.size()), dg(x.size()), r(x.size());
  cpu::gelu_forward(g.data(), x.data(), n);
  cpu::gelu_backward(dg.data(), x.data(), d.data(), n);
  cpu::residual_forward(r.data(), x.data(), y.data(), n);
  auto d_x = up(x), d_y = up(y), d_d = up(d);
  DeviceBuffer<float> d_g(*be_, n), d_dg(*be_, n), d_r(*be_, n), d_f(*be_, n);
  be_->gelu_forward(d_g.data(), d_x.data(), n);
  be_->gelu_backward(d_dg.data(), d_x.data(), d_d.data(), n);
  be_->residual_forward(d_r.data(), d_x.data(), d_y.data(), n);
  be_->fill(d_f.data(), n, -2.5f);
  check(d_g, g, "gelu out");
  check(d_dg, dg, "gelu dinp");
  check(d_r, r, "residual out");
  check(d_f, std::vector<float>(size_t(n), -2.5f), "fill");
}

TEST_F(BackendOps, CrossEntropyOverTheRealVocabulary) { check_crossentropy(kN, 100, 128); }

// A tensor-parallel rank's pieces: vocabulary shard [64, 128) of a vocabulary of 100 (36 real
// columns), the embedding with and without wpe, the three cross-entropy steps, the bias add.
TEST_F(BackendOps, VocabularyShardOps) {
  const int C = 32, Vpl = 64, off = 64, real = 100 - off, maxT = 64;
  std::vector<int32_t> tok(kN), pos(kN);
  for (int n = 0; n < kN; ++n) tok[size_t(n)] = (n * 7) % 100, pos[size_t(n)] = n % 31;
  const auto wte = randn(size_t(Vpl) * C, 30), wpe = randn(size_t(maxT) * C, 31),
             dout = randn(size_t(kN) * C, 32), bias = randn(C, 34);
  std::vector<float> e1(size_t(kN) * C), e2(e1.size()), dw(wte.size(), 0.5f), dp(wpe.size(), 0.f);
  cpu::vocab_embedding_forward(e1.data(), tok.data(), pos.data(), wte.data(), wpe.data(), kN, C,
                               Vpl, off);
  cpu::vocab_embedding_forward(e2.data(), tok.data(), pos.data(), wte.data(),
                               static_cast<const float*>(nullptr), kN, C, Vpl, off);
  cpu::vocab_embedding_backward(dw.data(), dp.data(), dout.data(), tok.data(), pos.data(), kN, C,
                                Vpl, off);
  std::vector<float> biased = e1;
  cpu::bias_add(biased.data(), bias.data(), kN, C);

  auto d_tok = up(tok), d_pos = up(pos);
  auto d_wte = up(wte), d_wpe = up(wpe), d_dout = up(dout), d_bias = up(bias);
  DeviceBuffer<float> d_e1(*be_, kN * C), d_e2(*be_, kN * C);
  auto d_dw = up(std::vector<float>(wte.size(), 0.5f)), d_dp = up(std::vector<float>(wpe.size()));
  be_->vocab_embedding_forward(d_e1.data(), d_tok.data(), d_pos.data(), d_wte.data(),
                               d_wpe.data(), kN, C, Vpl, off);
  be_->vocab_embedding_forward(d_e2.data(), d_tok.data(), d_pos.data(), d_wte.data(), nullptr, kN,
                               C, Vpl, off);
  be_->vocab_embedding_backward(d_dw.data(), d_dp.data(), d_dout.data(), d_tok.data(), d_pos.data(),
                                kN, C, Vpl, off);
  be_->bias_add(d_e1.data(), d_bias.data(), kN, C);
  check(d_e1, biased, "vocab embedding + wpe + bias");
  check(d_e2, e2, "vocab embedding, no wpe");
  check(d_dw, dw, "vocab embedding dwte (+=)");
  check(d_dp, dp, "vocab embedding dwpe (+=)");
  check_vocab_crossentropy(kN, Vpl, off, real);
}

TEST_F(BackendOps, AdamWAndSumSquares) {
  const int64_t n = 5000;
  auto p = randn(size_t(n), 24), m = randn(size_t(n), 25, 0.1f), v = randn(size_t(n), 26, 0.1f);
  for (float& e : v) e = e * e;
  const auto g = randn(size_t(n), 27);
  auto d_p = up(p), d_m = up(m), d_v = up(v), d_g = up(g);
  for (int64_t t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      0.5f, t);
    be_->adamw_update(d_p.data(), d_g.data(), d_m.data(), d_v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                      0.1f, 0.5f, t);
  }
  check(d_p, p, "adamw params");
  check(d_m, m, "adamw m");
  check(d_v, v, "adamw v");
  check_sum_squares(g);
}

// Rows longer than a block's 256 threads (each thread strides over several elements, the last
// stride partial), more rows than one part of the parameter-gradient sums (64), a shard whose real
// columns end inside the row, a squared sum of several parts.
TEST_F(BackendOps, RowReductionsOverLongRows) {
  check_layernorm(150, 700);
  check_crossentropy(9, 1000, 1024);
  check_vocab_crossentropy(9, 640, 640, 601);
  check_sum_squares(randn(50000, 40));
  check_sum_squares(randn(1, 41));
}

#if !BERTH_TEST_CUDA
// The block-per-row kernels (kernels/cuda/row_bodies.h) with a host thread per GPU thread and real
// barriers (SIMT mode): the tree reductions in shared memory in the GPU's order, against the CPU
// reference. A missing barrier in a reduction lets a thread read a partial sum before its
// neighbour wrote it (0xff NaN fill or a stale value), and fails here or under ThreadSanitizer
// (scripts/race_check).
TEST_F(BackendOps, RowKernelsAreRightWithEveryThreadOfABlockRunning) {
  be_ = test::make_host_items_backend(false, 0, SIZE_MAX, /*simt=*/true);
  check_layernorm(3, 300);
  check_layernorm(2, 48);  // fewer channels than threads: the idle threads' zeros join the tree
  check_crossentropy(5, 600, 640);
  check_vocab_crossentropy(5, 320, 320, 290);
  check_vocab_crossentropy(5, 128, 128, 100);  // idle threads' −inf and 0
  check_sum_squares(randn(40000, 42));
}

// The bodies of a GEMM's bias gradient on the CUDA backend (backend.cu's weight_grads; the
// host-items backend's GEMMs are the CPU's, so gpu.BackendOps.MatmulForwardAndBackward is what
// runs the wiring): parts of 64 rows, then each column's parts, onto what the gradient held.
TEST(CudaBodies, BiasGradientSumsRowsInParts) {
  const int N = 150, OC = 37;
  const auto dout = randn(size_t(N) * OC, 43);
  const int parts = cuda::body::column_parts(N);
  ASSERT_EQ(parts, 3);
  std::vector<float> part(size_t(parts) * OC, std::nanf("")), dbias(size_t(OC), 0.5f);
  for (int64_t i = 0; i < int64_t(part.size()); ++i)
    cuda::body::bias_grad_partial(i, part.data(), dout.data(), N, OC);
  for (int o = 0; o < OC; ++o)
    cuda::body::add_column_parts(o, dbias.data(), part.data(), parts, OC);
  for (int o = 0; o < OC; ++o) {
    double ref = 0.5;
    for (int n = 0; n < N; ++n) ref += dout[size_t(n) * OC + size_t(o)];
    EXPECT_NEAR(dbias[size_t(o)], ref, 1e-5 * (1 + std::abs(ref))) << "column " << o;
  }
}
#endif

TEST_F(BackendOps, MemoryIsAccountedAndReturned) {
  const int64_t before = be_->bytes_in_use();
  {
    DeviceBuffer<float> a(*be_, 1 << 20);
    EXPECT_GE(be_->bytes_in_use(), before + int64_t(4 << 20));
    be_->zero(a.data(), a.bytes());
    std::vector<float> h(4);
    be_->download(h.data(), a.data() + 100, sizeof(float) * 4);
    EXPECT_EQ(h, std::vector<float>(4, 0.f));
  }
  be_->synchronize();  // a CUDA release is stream-ordered (cudaFreeAsync)
  EXPECT_EQ(be_->bytes_in_use(), before);
  EXPECT_GE(be_->peak_bytes(), before + int64_t(4 << 20));
}

#if !BERTH_TEST_CUDA
// The guarded host-items backend (tests/host_items_backend.h) faults on host access to its memory
// outside its calls, as a GPU's memory would: what test_model_backend and test_train rely on.
TEST(GuardedHostItems, HostAccessOutsideACallFaults) {
  auto be = test::make_host_items_backend(true);
  DeviceBuffer<float> buf(*be, 16);
  be->fill(buf.data(), 16, 2.0f);
  std::vector<float> h(16);
  be->download(h.data(), buf.data(), buf.bytes());
  EXPECT_EQ(h[15], 2.0f);
  volatile float* raw = buf.data();
  EXPECT_DEATH({ h[0] = raw[3]; }, "");
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16's spacing in [1, 2)
  EXPECT_EQ(cpu::round_to_bf16(one), one);
  EXPECT_EQ(cpu::round_to_bf16(-2.5f), -2.5f);
  EXPECT_EQ(cpu::round_to_bf16(one + 0.5f * ulp), one) << "a tie goes to the even neighbour";
  EXPECT_EQ(cpu::round_to_bf16(one + 1.5f * ulp), one + 2 * ulp) << "a tie goes to the even one";
  EXPECT_EQ(cpu::round_to_bf16(one + 0.5f * ulp + std::ldexp(1.0f, -20)), one + ulp);
  EXPECT_EQ(cpu::round_to_bf16(one + 0.49f * ulp), one);
  EXPECT_EQ(cpu::round_to_bf16(std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity())
      << "past bf16's largest finite value";
  EXPECT_EQ(cpu::round_to_bf16(-std::numeric_limits<float>::infinity()),
            -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(cpu::round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu::round_to_bf16(std::bit_cast<float>(0x7f800001u))))
      << "a NaN whose payload sits in the dropped bits stays NaN";
  // every result is a bf16 value: its low 16 bits are zero
  const auto v = randn(1000, 16, 100.0f);
  for (float x : v) EXPECT_EQ(std::bit_cast<uint32_t>(cpu::round_to_bf16(x)) & 0xffffu, 0u);
}

TEST(BackendFactory, ChoosesAndExplains) {
  EXPECT_EQ(make_backend("cpu", 0)->kind(), DeviceKind::kCpu);
  try {
    make_backend("tpu", 0);
    FAIL() << "an unknown device must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"auto\", \"cpu\" or \"cuda\""), std::string::npos);
  }
  const auto any = make_backend("auto", 0);  // CUDA when usable here, else the CPU
  EXPECT_TRUE(any->kind() == DeviceKind::kCpu || any->kind() == DeviceKind::kCuda);
  if (any->kind() == DeviceKind::kCpu) {
    // no usable CUDA here: asking for it by name is an error that says why
    EXPECT_THROW(make_backend("cuda", 0), Error);
  }
  EXPECT_EQ(&cpu_backend(), &cpu_backend());
}

TEST(BackendFactory, EachRankTakesItsOwnGpu) {
  // 8 GPUs shown to each of 8 ranks: rank r takes GPU r (and fewer ranks, the first ones).
  for (int r = 0; r < 8; ++r) EXPECT_EQ(cuda_device_for_rank(8, r, 8, false), r);
  EXPECT_EQ(cuda_device_for_rank(8, 1, 2, true), 1);
  // srun --gpus-per-task=1: each of 4 ranks sees its own GPU as device 0.
  for (int r = 0; r < 4; ++r) EXPECT_EQ(cuda_device_for_rank(1, r, 4, true), 0);
  // More ranks than GPUs with no binding, or 2 visible to each of 4 ranks: refused with the fixes.
  test::expect_error([] { cuda_device_for_rank(1, 1, 4, false); },
                     {"4 ranks run on this host but this rank sees 1 GPU(s)",
                      "srun --gpus-per-task=1", "run.device = \"cpu\""});
  test::expect_error([] { cuda_device_for_rank(2, 3, 4, true); }, {"sees 2 GPU(s)"});
}
#endif

}  // namespace
}  // namespace berth
