// Tensor-parallel primitives against one rank (run under mpirun -np 1, 2 and 4; the world is the
// tp group): every output matches within kTensorParallel, and at tp = 1 each is the plain op.
// The column-parallel forward is not bit-equal to the single-rank slice with OpenBLAS: sgemm picks
// its kernel by matrix shape, so a 256-wide shard and the 512-wide whole round differently
// (measured up to 1.3e-6 on O(1) outputs, K = 256).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ops.h"
#include "parallel/tensor_parallel.h"
#include "runtime/core/check.h"
#include "tests/host_items_backend.h"
#include "tests/mpi_world.h"
#include "tests/tolerance.h"

namespace berth {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& ref, test::Tol tol,
                 const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const std::vector<double> g(got.begin(), got.end()), r(ref.begin(), ref.end());
  test::expect_close(g.data(), r.data(), int64_t(g.size()), tol, what);
}

constexpr int N = 64, IC = 256, OC = 512;  // divisible by tp in {1, 2, 4}

void ColumnLinearMatchesOneRank(Backend* be) {
  Communicator& tp = test::world();
  const int r = tp.rank(), P = tp.size(), OCl = OC / P;
  const auto inp = randn(size_t(N) * IC, 1), w = randn(size_t(OC) * IC, 2, 0.1f),
             b = randn(OC, 3), dout = randn(size_t(N) * OC, 4);
  // one rank
  std::vector<float> out(size_t(N) * OC), dinp(size_t(N) * IC), dw(size_t(OC) * IC, 0.f),
      db(OC, 0.f);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                       OC);
  // this rank's shard
  const auto wl = shard_rows(w.data(), OC, IC, P, r), bl = shard_rows(b.data(), OC, 1, P, r);
  const auto doutl = shard_cols(dout.data(), N, OC, P, r);
  std::vector<float> outl(size_t(N) * OCl), dinpl(size_t(N) * IC), dwl(wl.size(), 0.f),
      dbl(bl.size(), 0.f);
  column_linear_forward(be, outl.data(), inp.data(), wl.data(), bl.data(), N, IC, OCl);
  // The same dot products over IC as one rank's, but OpenBLAS may block a narrower output in
  // another order (its Zen/Haswell sgemm does at 128 of 512 columns: 200 of 8192 elements differ
  // in the last bit at np 4), so within the tensor-parallel tolerance, not bit for bit.
  expect_near(outl, shard_cols(out.data(), N, OC, P, r), test::kTensorParallel, "column out");
  column_linear_backward(be, &tp, dinpl.data(), dwl.data(), dbl.data(), doutl.data(),
                         inp.data(), wl.data(), N, IC, OCl);
  expect_near(dinpl, dinp, test::kTensorParallel, "column dinp");
  expect_near(dwl, shard_rows(dw.data(), OC, IC, P, r), test::kTensorParallel, "column dw");
  expect_near(dbl, shard_rows(db.data(), OC, 1, P, r), test::kTensorParallel, "column db");
}

void RowLinearMatchesOneRank(Backend* be) {
  Communicator& tp = test::world();
  const int r = tp.rank(), P = tp.size(), ICl = IC / P;
  const auto inp = randn(size_t(N) * IC, 5), w = randn(size_t(OC) * IC, 6, 0.1f), b = randn(OC, 7),
             dout = randn(size_t(N) * OC, 8);
  std::vector<float> out(size_t(N) * OC), dinp(size_t(N) * IC), dw(size_t(OC) * IC, 0.f),
      db(OC, 0.f);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC,
                       OC);
  const auto inpl = shard_cols(inp.data(), N, IC, P, r), wl = shard_cols(w.data(), OC, IC, P, r);
  std::vector<float> outl(size_t(N) * OC), dinpl(inpl.size()), dwl(wl.size(), 0.f), dbl(OC, 0.f);
  row_linear_forward(be, &tp, outl.data(), inpl.data(), wl.data(), b.data(), N, ICl, OC);
  expect_near(outl, out, test::kTensorParallel, "row out");
  row_linear_backward(be, dinpl.data(), dwl.data(), dbl.data(), dout.data(), inpl.data(),
                      wl.data(), N, ICl, OC);
  expect_near(dinpl, shard_cols(dinp.data(), N, IC, P, r), test::kTensorParallel, "row dinp");
  expect_near(dwl, shard_cols(dw.data(), OC, IC, P, r), test::kTensorParallel, "row dw");
  expect_near(dbl, db, test::kTensorParallel, "row db");
}

void VocabParallelEmbeddingMatchesOneRank(Backend* be) {
  Communicator& tp = test::world();
  const int r = tp.rank(), P = tp.size();
  const int C = 24, Vp = 256, Vl = Vp / P, maxT = 8;
  const auto wte = randn(size_t(Vp) * C, 11), wpe = randn(size_t(maxT) * C, 12),
             dout = randn(size_t(N) * C, 13);
  std::vector<int32_t> tokens(N), positions(N);
  for (int n = 0; n < N; ++n) {
    tokens[size_t(n)] = (n * 53 + 7) % 250;
    positions[size_t(n)] = n % maxT;
  }
  tokens[1] = tokens[4];  // a repeated token accumulates twice
  std::vector<float> out(size_t(N) * C), dwte(wte.size(), 0.f), dwpe(wpe.size(), 0.f);
  cpu::encoder_forward(out.data(), tokens.data(), positions.data(), wte.data(), wpe.data(), N, C);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), positions.data(), N,
                        C);
  const auto wl = shard_rows(wte.data(), Vp, C, P, r);
  std::vector<float> outl(out.size()), dwl(wl.size(), 0.f), dwpel(wpe.size(), 0.f);
  vocab_parallel_embedding_forward(be, &tp, outl.data(), tokens.data(), positions.data(),
                                   wl.data(), wpe.data(), N, C, Vl, r * Vl);
  expect_near(outl, out, test::kTensorParallel, "vocab-parallel embedding");
  vocab_parallel_embedding_backward(be, &tp, dwl.data(), dwpel.data(), dout.data(),
                                    tokens.data(), positions.data(), N, C, Vl, r * Vl);
  expect_near(dwl, shard_rows(dwte.data(), Vp, C, P, r), test::kTensorParallel, "dwte shard");
  expect_near(dwpel, dwpe, test::kTensorParallel, "dwpe (replicated)");
}

void VocabParallelCrossEntropyMatchesOneRank(Backend* be) {
  Communicator& tp = test::world();
  const int r = tp.rank(), P = tp.size();
  const int V = 250, Vp = 256, Vl = Vp / P;  // padded columns live on the last rank
  auto logits = randn(size_t(N) * Vp, 9, 3.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[size_t(n)] = n == 3 ? -1 : (n * 37) % V;
  targets[5] = V - 1;
  std::vector<float> losses(N), dlogits(logits.size());
  cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
  cpu::crossentropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0f / N, N, V, Vp);
  const auto ll = shard_cols(logits.data(), N, Vp, P, r);
  std::vector<float> lossl(N), lse(N), dl(ll.size());
  vocab_parallel_cross_entropy_forward(be, &tp, lossl.data(), lse.data(), ll.data(),
                                       targets.data(), N, V, Vl, r * Vl);
  expect_near(lossl, losses, test::kTensorParallel, "vocab-parallel loss");
  EXPECT_EQ(lossl[3], 0.f) << "ignored target";
  vocab_parallel_cross_entropy_backward(be, &tp, dl.data(), ll.data(), lse.data(),
                                        targets.data(), 1.0f / N, N, V, Vl, r * Vl);
  expect_near(dl, shard_cols(dlogits.data(), N, Vp, P, r), test::kTensorParallel,
              "vocab-parallel dlogits");
}

// Every primitive on the CPU backend, and on the CUDA backend's ops run on the host
// (tests/host_items_backend.h), whose buffers are host memory like these vectors.
TEST(TensorParallel, ColumnLinearMatchesOneRank) {
  ColumnLinearMatchesOneRank(nullptr);
  ColumnLinearMatchesOneRank(test::make_host_items_backend().get());
}
TEST(TensorParallel, RowLinearMatchesOneRank) {
  RowLinearMatchesOneRank(nullptr);
  RowLinearMatchesOneRank(test::make_host_items_backend().get());
}
TEST(TensorParallel, VocabParallelEmbeddingMatchesOneRank) {
  VocabParallelEmbeddingMatchesOneRank(nullptr);
  VocabParallelEmbeddingMatchesOneRank(test::make_host_items_backend().get());
}
TEST(TensorParallel, VocabParallelCrossEntropyMatchesOneRank) {
  VocabParallelCrossEntropyMatchesOneRank(nullptr);
  VocabParallelCrossEntropyMatchesOneRank(test::make_host_items_backend().get());
}

TEST(TensorParallel, ShardingRefusesIndivisibleDimensions) {
  const std::vector<float> m(6 * 5, 1.f);
  EXPECT_THROW(shard_cols(m.data(), 6, 5, 2, 0), Error);
  EXPECT_THROW(shard_rows(m.data(), 5, 6, 2, 0), Error);
  EXPECT_EQ(shard_rows(m.data(), 6, 5, 3, 2).size(), 10u);
}

}  // namespace
}  // namespace berth
