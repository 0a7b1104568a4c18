// The NCCL communicator on the CUDA backend (label gpu): every collective on device buffers and on
// host buffers (staged), uneven ZeRO counts, grouped send/recv around a ring, split, and ring
// attention on the CUDA backend over NCCL against the CPU backend. One rank per GPU: NCCL refuses
// two ranks of one communicator on the same device, so a one-GPU machine runs one rank. Two builds:
//   - under mpirun (tests/mpi_test_main.cpp): the world communicator, bootstrapped over MPI, and
//     the CPU ring over MPI;
//   - without MPI (BERTH_TEST_NO_MPI, the GPU check's box has no MPI): one rank made by make_nccl
//     alone, so the check still runs the NCCL calls on the GPU (all but the grouped uneven path,
//     which needs two ranks).
// Without a GPU or without NCCL every test skips and says why.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/context_parallel.h"
#include "runtime/comm/nccl.h"
#include "runtime/core/check.h"
#include "tests/tolerance.h"
#if !BERTH_TEST_NO_MPI
#include "tests/mpi_world.h"
#endif

namespace berth {
namespace {

struct Gpu {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Communicator> comm;
  std::string why_not;
};

Gpu& gpu() {
  static Gpu g = [] {
    Gpu x;
#if BERTH_TEST_NO_MPI
    const int local_rank = 0;
#else
    const int local_rank = mpi_local_rank().rank;
#endif
    if (!nccl_built()) {
      x.why_not = "this berth has no NCCL communicator";
    } else {
      try {
        x.be = make_backend("cuda", local_rank);
#if BERTH_TEST_NO_MPI
        x.comm = make_nccl(*x.be);
#else
        x.comm = make_nccl_world(*x.be);
#endif
      } catch (const Error& e) {
        x.why_not = e.what();
        x.be.reset();
      }
    }
#if !BERTH_TEST_NO_MPI
    // every rank skips or none does
    const int ok = test::world().all_reduce_value(int(x.comm != nullptr), ReduceOp::SUM);
    if (ok != test::world().size()) {
      x.comm.reset(), x.be.reset();
      if (x.why_not.empty()) x.why_not = "another rank has no usable GPU";
    }
#endif
    return x;
  }();
  return g;
}

// The communicator of the CPU ring the GPU ring is checked against: MPI over the same ranks, or,
// on one rank without MPI, the NCCL communicator itself (a ring of one rank makes no calls).
Communicator& host_ring() {
#if BERTH_TEST_NO_MPI
  return *gpu().comm;
#else
  return test::world();
#endif
}

#define NEED_GPU()                                                    \
  do {                                                                \
    if (!gpu().comm) GTEST_SKIP() << "no GPU + NCCL: " << gpu().why_not; \
  } while (0)

template <typename T>
DeviceBuffer<T> up(const std::vector<T>& h) {
  DeviceBuffer<T> d(*gpu().be, int64_t(h.size()));
  gpu().be->upload(d.data(), h.data(), d.bytes());
  return d;
}
template <typename T>
std::vector<T> down(const DeviceBuffer<T>& d) {
  std::vector<T> h(size_t(d.size()));
  gpu().be->download(h.data(), d.data(), d.bytes());
  return h;
}

// Outputs go to buffers filled with a sentinel first, so a call that wrote nothing fails, also on
// one rank (where every collective is the identity).
constexpr float kSentinel = -7.0f;

TEST(Nccl, AllReduceOnDeviceAndHostBuffers) {
  NEED_GPU();
  Communicator& c = *gpu().comm;
  const int r = c.rank(), n = c.size();
  const float s = float(n * (n - 1) / 2);
  auto in = up(std::vector<float>{float(r), 1.0f, float(2 * r)});
  auto out = up(std::vector<float>(3, kSentinel));
  c.all_reduce(in.data(), out.data(), 3, DType::F32, ReduceOp::SUM);
  EXPECT_EQ(down(out), (std::vector<float>{s, float(n), 2 * s}));
  c.all_reduce(out.data(), out.data(), 3, DType::F32, ReduceOp::AVG);  // in place
  EXPECT_EQ(down(out), (std::vector<float>{s, float(n), 2 * s}));
  const int64_t mine = r + 10;  // host buffers, staged: out of place, then in place
  int64_t mx = -1;
  c.all_reduce(&mine, &mx, 1, DType::I64, ReduceOp::MAX);
  EXPECT_EQ(mx, n + 9);
  double sum = 1.5;
  c.all_reduce(&sum, &sum, 1, DType::F64, ReduceOp::SUM);
  EXPECT_EQ(sum, 1.5 * n);
}

// With one rank the counts are one entry, always "even": the grouped ncclReduce / ncclBroadcast
// path of uneven ZeRO shards needs two ranks (test_nccl under mpirun -np 2, on two GPUs).
TEST(Nccl, ReduceScatterAndAllGatherEvenAndUneven) {
  NEED_GPU();
  Communicator& c = *gpu().comm;
  const int r = c.rank(), n = c.size();
  for (bool even : {true, false}) {
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) counts[size_t(i)] = even ? 4 : size_t(2 + i);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
    std::vector<float> full(total);
    for (size_t i = 0; i < total; ++i) full[i] = float(i + 1) * float(r + 1);
    auto d_full = up(full);
    auto d_mine = up(std::vector<float>(counts[size_t(r)], kSentinel));
    c.reduce_scatter(d_full.data(), d_mine.data(), counts, DType::F32, ReduceOp::SUM);
    size_t off = 0;
    for (int i = 0; i < r; ++i) off += counts[size_t(i)];
    const float ranks_sum = float(n * (n + 1) / 2);
    const auto mine = down(d_mine);
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], float(off + i + 1) * ranks_sum);
    auto d_all = up(std::vector<float>(total, kSentinel));
    c.all_gather(d_mine.data(), d_all.data(), counts, DType::F32);
    const auto all = down(d_all);
    for (size_t i = 0; i < total; ++i) EXPECT_EQ(all[i], float(i + 1) * ranks_sum) << i;
  }
}

TEST(Nccl, BroadcastGroupedRingAndSplit) {
  NEED_GPU();
  Communicator& c = *gpu().comm;
  const int r = c.rank(), n = c.size();
  auto b = up(std::vector<int32_t>{r == 0 ? 7 : -1, r == 0 ? 8 : -1});
  c.broadcast(b.data(), 2, DType::I32, 0);
  EXPECT_EQ(down(b), (std::vector<int32_t>{7, 8}));
  auto mine = up(std::vector<int32_t>{r + 100});
  auto got = up(std::vector<int32_t>{-1});
  c.group_begin();
  c.send(mine.data(), 1, DType::I32, (r + 1) % n);
  c.recv(got.data(), 1, DType::I32, (r - 1 + n) % n);
  c.group_end();
  EXPECT_EQ(down(got)[0], (r - 1 + n) % n + 100);
  auto half = c.split(r % 2, r);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(half->all_reduce_value(1, ReduceOp::SUM), half->size());
}

// Ring attention over every rank: CUDA backend + NCCL vs CPU backend + MPI, same shards.
TEST(Nccl, RingAttentionOnTheGpuEqualsTheCpuRing) {
  NEED_GPU();
  Communicator& c = *gpu().comm;
  const int n = 48, C = 128, NH = 2;  // head size 64
  std::mt19937 rng(100 + c.rank());
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(size_t(n) * C), k(q.size()), v(q.size()), dout(q.size());
  for (auto* x : {&q, &k, &v, &dout})
    for (float& e : *x) e = nd(rng);
  std::vector<int32_t> seq(static_cast<size_t>(n)), pos(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)  // two documents; rank r holds positions r·24.. of each
    seq[size_t(i)] = i < 24 ? 0 : 1, pos[size_t(i)] = c.rank() * 24 + i % 24;
  // CPU + MPI
  Backend& cpu = cpu_backend();
  std::vector<float> o(q.size()), lse(size_t(n) * NH), dq(q.size()), dk(q.size()), dv(q.size());
  ring_attention_forward(cpu, host_ring(), o.data(), lse.data(), q.data(), k.data(), v.data(),
                         seq.data(), pos.data(), n, C, NH);
  ring_attention_backward(cpu, host_ring(), dq.data(), dk.data(), dv.data(), dout.data(), o.data(),
                          lse.data(), q.data(), k.data(), v.data(), seq.data(), pos.data(), n, C,
                          NH);
  // CUDA + NCCL
  Backend& be = *gpu().be;
  auto d_q = up(q), d_k = up(k), d_v = up(v), d_do = up(dout);
  auto d_seq = up(seq), d_pos = up(pos);
  DeviceBuffer<float> d_o(be, n * C), d_lse(be, n * NH), d_dq(be, n * C), d_dk(be, n * C),
      d_dv(be, n * C);
  ring_attention_forward(be, c, d_o.data(), d_lse.data(), d_q.data(), d_k.data(), d_v.data(),
                         d_seq.data(), d_pos.data(), n, C, NH);
  ring_attention_backward(be, c, d_dq.data(), d_dk.data(), d_dv.data(), d_do.data(), d_o.data(),
                          d_lse.data(), d_q.data(), d_k.data(), d_v.data(), d_seq.data(),
                          d_pos.data(), n, C, NH);
  const std::pair<const DeviceBuffer<float>*, const std::vector<float>*> pairs[] = {
      {&d_o, &o}, {&d_lse, &lse}, {&d_dq, &dq}, {&d_dk, &dk}, {&d_dv, &dv}};
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int t = 0; t < 5; ++t) {
    const auto got = down(*pairs[t].first);
    const std::vector<double> g(got.begin(), got.end());
    const std::vector<double> r(pairs[t].second->begin(), pairs[t].second->end());
    test::expect_close(g.data(), r.data(), int64_t(g.size()), test::kBackendF32, names[t]);
  }
}

}  // namespace
}  // namespace berth
