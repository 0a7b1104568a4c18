// Gradient synchronization of data parallelism, per step, for the flat gradient buffers of three
// model sizes, side by side in one run:
//   mpi-ar   the trainer's ZeRO-0 path: bucketed MPI_Allreduce (all_reduce_gradients)
//   mpi-rs+ag the trainer's ZeRO-1 path: MPI reduce-scatter of gradients + all-gather of shards
//   ring     the same sum as a ring on grouped send/recv (ring_all_reduce); the bytes this rank
//            sent are counted (CommStats::send_bytes), so they can be set against the theory
// Theory: a bandwidth-optimal all-reduce sends 2(n−1)/n × gradient bytes per rank per step.
// Open MPI's own collectives do not expose the bytes they put on the transport, so for the mpi
// rows only the time is measured; "bus GB/s" = theory bytes ÷ time (nccl-tests' convention).
//
//   mpirun -np N bench_grad_sync [--reps R]
#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "parallel/data_parallel.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/check.h"
#include "runtime/model/gpt_config.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int L, C, NH, V, T;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  CLI::App app{"Gradient synchronization bytes and time per step over the MPI ranks"};
  app.add_option("--reps", reps, "Repetitions (the median is printed)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  MPI_Init(&argc, &argv);
  {
    std::unique_ptr<berth::Communicator> world = berth::make_mpi_world();
    const int n = world->size(), rank = world->rank();
    const Shape shapes[] = {{"tiny (configs/tiny.toml)", 4, 128, 4, 257, 128},
                            {"(a) L4 C256", 4, 256, 4, 257, 256},
                            {"L12 C512 V8192", 12, 512, 8, 8192, 256}};
    if (rank == 0) {
      std::printf("bench_grad_sync: %d ranks, median of %d reps, fp32 gradients\n", n, reps);
      std::printf("%-26s %9s %10s | %13s %13s %6s | %9s %9s\n", "model", "params", "method",
                  "sent B/rank", "theory B", "ratio", "ms", "bus GB/s");
    }
    for (const Shape& s : shapes) {
      const berth::GPTConfig cfg = berth::make_gpt_config(s.L, s.NH, s.C, s.V, s.T);
      const int64_t total = berth::gpt_param_layout(cfg).total;
      std::vector<float> grads(static_cast<size_t>(total)), params(grads), shard, scratch;
      for (int64_t i = 0; i < total; i++) grads[size_t(i)] = float((i + rank) % 7);
      const std::vector<size_t> counts = berth::shard_counts(total, n);
      const berth::ShardRange mine = berth::shard_range(total, n, rank);
      shard.resize(size_t(mine.size()));
      const double theory = 2.0 * (n - 1) / n * double(total) * sizeof(float);
      const char* methods[] = {"mpi-ar", "mpi-rs+ag", "ring"};
      for (int m = 0; m < 3; m++) {
        std::vector<double> times;
        world->reset_stats();
        for (int r = 0; r < reps; r++) {
          world->barrier();
          const auto t0 = Clock::now();
          if (m == 0) {
            berth::all_reduce_gradients(*world, grads.data(), total, berth::kGradBucketElems);
          } else if (m == 1) {
            world->reduce_scatter(grads.data(), shard.data(), counts, berth::DType::F32,
                                  berth::ReduceOp::SUM);
            world->all_gather(params.data() + mine.begin, params.data(), counts,
                              berth::DType::F32);
          } else {
            berth::ring_all_reduce(*world, grads.data(), total, &scratch);
          }
          times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        const double t = median(times);
        if (rank == 0) {
          const std::string sent =
              m == 2 ? fmt::format("{:13.0f}", double(world->stats().send_bytes) / reps)
                     : fmt::format("{:>13}", "n/a");
          const std::string ratio =
              m == 2 && theory > 0  // (one rank sends nothing, and should not)
                  ? fmt::format("{:6.3f}", double(world->stats().send_bytes) / reps / theory)
                  : fmt::format("{:>6}", m == 2 ? "-" : "");
          std::printf("%-26s %8.2fM %10s | %s %13.0f %s | %9.2f %9.2f\n", s.name,
                      double(total) / 1e6, methods[m], sent.c_str(), theory, ratio.c_str(),
                      t * 1e3, theory / t / 1e9);
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}
