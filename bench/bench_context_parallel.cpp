// Context parallelism: per-rank activation memory and ring-attention time versus cp, for one
// sequence of T tokens. Run under mpirun with a world of 4 (cp = 1, 2, 4 are measured in turn on
// the first cp ranks):
//   mpirun -np 4 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 build/bench/bench_context_parallel [T]
// Memory: the model's allocated activations (GPT(B = 1, T/cp) with ring attention: per-layer LSE
// instead of T² probabilities). Time: one forward + backward of ring attention on random
// q, k, v, first with each transfer completed before the next block is computed, then with it
// posted before and completed after (overlap); the exposed communication is the cp
// communicator's time inside its calls, and "hidden" is the share of the first run's exposed
// time that the overlapped run no longer waits for.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "packing/cp_shard.h"
#include "parallel/context_parallel.h"
#include "runtime/comm/communicator.h"
#include "runtime/model/gpt.h"

int main(int argc, char** argv) {
  int T = 4096;
  CLI::App app{"Activation memory and ring-attention time of one sequence versus cp (1, 2, 4)"};
  app.add_option("T", T, "Tokens in the sequence (a multiple of 2·4 = 8, the largest cp's chunks)")
      ->check(CLI::Range(8, 1 << 20))
      ->check([](const std::string& v) {
        return std::stol(v) % 8 == 0 ? std::string() : std::string("T must be a multiple of 8");
      });
  CLI11_PARSE(app, argc, argv);
  MPI_Init(&argc, &argv);
  using namespace berth;
  std::unique_ptr<Communicator> world = make_mpi_world();
  const int L = 4, NH = 4, C = 128;
  const GPTConfig g = make_gpt_config(L, NH, C, 257, T);
  if (world->rank() == 0) {
    std::printf("one sequence of T = %d tokens, L = %d, C = %d, NH = %d, fp32, %d OpenMP thread(s)\n",
                T, L, C, NH, 1);
    std::printf("%4s | %14s | %12s | %10s | %10s | %8s | %10s | %10s | %8s\n", "cp",
                "act MiB/rank", "vs cp=1", "ring ms", "comm ms", "exposed", "overlap ms",
                "comm ms", "hidden");
  }
  double base = 0;
  for (int cp : {1, 2, 4}) {
    if (cp > world->size()) break;
    const int color = world->rank() < cp ? 0 : -1;
    std::unique_ptr<Communicator> group = world->split(color, world->rank());
    if (group) {
      GPT<float> model(g, 1, T / cp);
      model.set_context_parallel(group.get());
      const double mib = double(model.activation_bytes()) / (1024.0 * 1024.0);
      // Ring attention on this rank's zigzag shard of one sequence.
      PackedBatch b;
      b.B = 1;
      b.T = T;
      for (int i = 0; i < T; ++i) b.tokens.push_back(0), b.targets.push_back(0), b.positions.push_back(i);
      b.cu_seqlens = {0, T};
      const CpShard sh = cp_shard(b, cp, group->rank());
      const int n = sh.n();
      std::vector<int32_t> seq(size_t(n), 0);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> q(size_t(n) * C), k(q.size()), v(q.size()), dout(q.size()), out(q.size()),
          dq(q.size()), dk(q.size()), dv(q.size()), lse(size_t(n) * NH);
      for (auto* x : {&q, &k, &v, &dout})
        for (float& e : *x) e = nd(rng);
      // Forward + backward, without and with the transfer posted before each block's compute.
      auto run = [&](bool overlap, double* wall_max, double* comm_max) {
        group->barrier();
        group->reset_stats();
        const auto t0 = std::chrono::steady_clock::now();
        ring_attention_forward(cpu_backend(), *group, out.data(), lse.data(), q.data(), k.data(), v.data(),
                               seq.data(), sh.positions.data(), n, C, NH, overlap);
        ring_attention_backward(cpu_backend(), *group, dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                lse.data(), q.data(), k.data(), v.data(), seq.data(),
                                sh.positions.data(), n, C, NH, overlap);
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // the slowest rank's figures
        *wall_max = group->all_reduce_value(wall, ReduceOp::MAX);
        *comm_max = group->all_reduce_value(group->stats().seconds, ReduceOp::MAX);
      };
      double w0 = 0, c0 = 0, w1 = 0, c1 = 0;
      run(false, &w0, &c0);
      run(true, &w1, &c1);
      if (cp == 1) base = mib;
      if (group->rank() == 0) {
        std::printf("%4d | %14.1f | %11.2fx | %10.1f | %10.1f | %7.1f%% | %10.1f | %10.1f | %7.1f%%\n",
                    cp, mib, base / mib, w0 * 1e3, c0 * 1e3, 100 * c0 / w0, w1 * 1e3, c1 * 1e3,
                    cp > 1 && c0 > 0 ? 100 * (c0 - c1) / c0 : 0.0);
        std::fflush(stdout);
      }
    }
    world->barrier();
  }
  MPI_Finalize();
  return 0;
}
