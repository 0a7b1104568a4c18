// Ring attention equals full attention (run under mpirun -np 1, 2, 3 and 4; the world is the cp
// group): causal, per document, with document lengths [17, 31, 11] and [509, 1013, 2039] sharded
// zigzag by cp_shard. Output, LSE, dQ, dK and dV of every real token match the single-rank
// reference (cpu::attention_forward/backward; LSE in double) within kRingAttention.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "packing/cp_shard.h"
#include "parallel/context_parallel.h"
#include "tests/host_items_backend.h"
#include "tests/mpi_world.h"
#include "tests/tolerance.h"

namespace berth {
namespace {

constexpr int NH = 2, C = 32, HS = C / NH;

void run_case(Backend& be, const std::vector<int>& lengths) {
  Communicator& cp = test::world();
  // One row holding the documents; token id = global index, so shards map back to rows.
  PackedBatch b;
  b.B = 1;
  b.cu_seqlens.push_back(0);
  for (int len : lengths) {
    for (int i = 0; i < len; ++i) {
      b.tokens.push_back(int32_t(b.tokens.size()));
      b.targets.push_back(0);
      b.positions.push_back(i);
    }
    b.cu_seqlens.push_back(int32_t(b.tokens.size()));
  }
  const int N = int(b.tokens.size()), S = int(lengths.size());
  b.T = N;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> qkv(size_t(N) * 3 * C), dout(size_t(N) * C);
  for (float& x : qkv) x = nd(rng);
  for (float& x : dout) x = nd(rng);
  // Reference on one rank.
  std::vector<float> out(size_t(N) * C), att(size_t(cpu::attention_att_size(b.cu_seqlens.data(), S, NH))),
      datt(att.size()), dqkv(qkv.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), b.cu_seqlens.data(), S, C, NH);
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                          b.cu_seqlens.data(), S, C, NH);
  // This rank's shard.
  const CpShard sh = cp_shard(b, cp.size(), cp.rank());
  const int n = sh.n();
  const size_t nc = size_t(n) * C;
  std::vector<float> q, k, v, dol;
  for (std::vector<float>* x : {&q, &k, &v, &dol}) x->assign(nc, 0.f);
  std::vector<int32_t> seq(static_cast<size_t>(n));
  std::vector<int> row(size_t(n), -1);  // global row of each real local token
  for (int s = 0; s < S; ++s) {
    for (int i = sh.cu_seqlens[size_t(s)]; i < sh.cu_seqlens[size_t(s) + 1]; ++i) {
      seq[size_t(i)] = s;
      if (sh.positions[size_t(i)] >= sh.seq_len[size_t(s)]) continue;  // padding
      const int g = sh.tokens[size_t(i)];
      row[size_t(i)] = g;
      for (int x = 0; x < C; ++x) {
        q[size_t(i) * C + x] = qkv[size_t(g) * 3 * C + x];
        k[size_t(i) * C + x] = qkv[size_t(g) * 3 * C + C + x];
        v[size_t(i) * C + x] = qkv[size_t(g) * 3 * C + 2 * C + x];
        dol[size_t(i) * C + x] = dout[size_t(g) * C + x];
      }
    }
  }
  // The ring runs in the backend's memory.
  auto up = [&](const auto& h) {
    DeviceBuffer<typename std::decay_t<decltype(h)>::value_type> d(be, int64_t(h.size()));
    be.upload(d.data(), h.data(), d.bytes());
    return d;
  };
  auto d_q = up(q), d_k = up(k), d_v = up(v), d_do = up(dol);
  auto d_seq = up(seq), d_pos = up(sh.positions);
  DeviceBuffer<float> d_o(be, int64_t(nc)), d_lse(be, int64_t(n) * NH), d_dq(be, int64_t(nc)),
      d_dk(be, int64_t(nc)), d_dv(be, int64_t(nc));
  ring_attention_forward(be, cp, d_o.data(), d_lse.data(), d_q.data(), d_k.data(), d_v.data(),
                         d_seq.data(), d_pos.data(), n, C, NH);
  ring_attention_backward(be, cp, d_dq.data(), d_dk.data(), d_dv.data(), d_do.data(), d_o.data(),
                          d_lse.data(), d_q.data(), d_k.data(), d_v.data(), d_seq.data(),
                          d_pos.data(), n, C, NH);
  std::vector<float> o(q.size()), lse(size_t(n) * NH), dq(q.size()), dk(q.size()), dv(q.size());
  be.download(o.data(), d_o.data(), d_o.bytes());
  be.download(lse.data(), d_lse.data(), d_lse.bytes());
  be.download(dq.data(), d_dq.data(), d_dq.bytes());
  be.download(dk.data(), d_dk.data(), d_dk.bytes());
  be.download(dv.data(), d_dv.data(), d_dv.bytes());
  // Compare real tokens.
  std::vector<std::vector<double>> got(5), ref(5);
  for (int i = 0; i < n; ++i) {
    const int g = row[size_t(i)];
    if (g < 0) continue;
    for (int x = 0; x < C; ++x) {
      got[0].push_back(o[size_t(i) * C + x]), ref[0].push_back(out[size_t(g) * C + x]);
      got[2].push_back(dq[size_t(i) * C + x]), ref[2].push_back(dqkv[size_t(g) * 3 * C + x]);
      got[3].push_back(dk[size_t(i) * C + x]), ref[3].push_back(dqkv[size_t(g) * 3 * C + C + x]);
      got[4].push_back(dv[size_t(i) * C + x]),
          ref[4].push_back(dqkv[size_t(g) * 3 * C + 2 * C + x]);
    }
    // LSE in double over the keys of the same document at positions <= this one.
    int s = 0;
    while (b.cu_seqlens[size_t(s) + 1] <= g) ++s;
    for (int h = 0; h < NH; ++h) {
      double mx = -1e300, sum = 0;
      std::vector<double> sc;
      for (int j = b.cu_seqlens[size_t(s)]; j <= g; ++j) {
        double d = 0;
        for (int x = 0; x < HS; ++x) {
          d += double(qkv[size_t(g) * 3 * C + h * HS + x]) *
               double(qkv[size_t(j) * 3 * C + C + h * HS + x]);
        }
        sc.push_back(d / std::sqrt(double(HS)));
        mx = std::max(mx, sc.back());
      }
      for (double x : sc) sum += std::exp(x - mx);
      got[1].push_back(lse[size_t(i) * NH + h]), ref[1].push_back(mx + std::log(sum));
    }
  }
  const char* names[5] = {"ring out", "ring lse", "ring dq", "ring dk", "ring dv"};
  for (int t = 0; t < 5; ++t) {
    ASSERT_FALSE(got[t].empty());
    test::expect_close(got[t].data(), ref[t].data(), int64_t(got[t].size()), test::kRingAttention,
                       names[t]);
  }
}

TEST(RingAttention, EqualsFullAttentionShortDocuments) { run_case(cpu_backend(), {17, 31, 11}); }
TEST(RingAttention, EqualsFullAttentionLongDocuments) {
  run_case(cpu_backend(), {509, 1013, 2039});
}
// The same ring on the CUDA backend's op wiring and thread bodies, run on the host: the algorithm
// is the Backend's, whichever backend computes the blocks.
TEST(RingAttention, EqualsFullAttentionOnTheCudaBackendsOpsRunOnTheHost) {
  auto be = test::make_host_items_backend();
  run_case(*be, {17, 31, 11});
  run_case(*be, {129, 200, 64});
}

}  // namespace
}  // namespace berth
