// Pipeline bubble: the measured idle share of a step against the theory (pp − 1)/(M + pp − 1),
// for the 1F1B and AFAB schedules, run by the real executor (parallel/pipeline.h: grouped
// send/recv of real activation buffers over MPI) with each stage's compute a fixed sleep —
// forward t, backward 2t, as in a transformer — so that the figure is the schedule's and the
// executor's, not the contention of more ranks than cores. Run with one rank per stage:
//   mpirun -np 4 --oversubscribe --bind-to none build/bench/bench_pipeline [t_ms] [floats]
// Bubble of a stage = 1 − (its compute time / the step's wall time); the table shows the mean
// over stages and the most idle stage, and the measured in-flight micro-batches (activation
// slots the stage would hold).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "parallel/pipeline.h"
#include "runtime/comm/communicator.h"

namespace {

class SleepStage final : public berth::PipelineStage {
 public:
  SleepStage(double forward_s, size_t floats, int microbatches)
      : forward_s_(forward_s), floats_(floats), act_(size_t(microbatches), std::vector<float>(floats)),
        grad_in_(floats), grad_out_(floats) {}
  void forward(int) override { sleep(forward_s_); }
  void backward(int) override { sleep(2 * forward_s_); }
  float* recv_activation(int m) override { return act_[size_t(m)].data(); }
  const float* send_activation(int m) override { return act_[size_t(m)].data(); }
  float* recv_grad(int) override { return grad_in_.data(); }
  const float* send_grad(int) override { return grad_out_.data(); }
  size_t activation_count(int) override { return floats_; }

 private:
  static void sleep(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }
  double forward_s_;
  size_t floats_;
  std::vector<std::vector<float>> act_;
  std::vector<float> grad_in_, grad_out_;
};

}  // namespace

int main(int argc, char** argv) {
  double forward_ms = 20.0;
  size_t floats = size_t(1) << 16;
  CLI::App app{"Pipeline bubble of 1F1B and AFAB against (pp − 1)/(M + pp − 1), one stage a rank"};
  app.add_option("forward_ms", forward_ms, "A stage's forward per micro-batch (backward: twice it)")
      ->check(CLI::Range(0.1, 10000.0));
  app.add_option("floats", floats, "Activation floats sent between stages")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  CLI11_PARSE(app, argc, argv);
  MPI_Init(&argc, &argv);
  using namespace berth;
  std::unique_ptr<Communicator> pp = make_mpi_world();
  const double t = forward_ms / 1e3;
  const int P = pp->size(), stage = pp->rank();
  if (stage == 0) {
    std::printf("pp = %d stages, forward %.0f ms + backward %.0f ms per micro-batch and stage, "
                "activation %zu floats\n",
                P, t * 1e3, 2 * t * 1e3, floats);
    std::printf("%-5s | %3s | %9s | %12s | %12s | %12s | %9s\n", "sched", "M", "step s",
                "theory", "bubble mean", "bubble worst", "in flight");
  }
  for (const char* name : {"1f1b", "afab"}) {
    for (int M : {1, 2, 4, 8, 16}) {
      const std::vector<PipeAction> actions = std::string(name) == "afab"
                                                  ? schedule_afab(P, stage, M)
                                                  : schedule_1f1b(P, stage, M);
      SleepStage s(t, floats, M);
      pp->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const PipelineTimes times = run_schedule(*pp, actions, s);
      pp->barrier();
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double idle = 1.0 - times.compute_s / wall;
      const double mean = pp->all_reduce_value(idle, ReduceOp::SUM) / P;
      const double worst = pp->all_reduce_value(idle, ReduceOp::MAX);
      const int in_flight = pp->all_reduce_value(max_in_flight(actions), ReduceOp::MAX);
      if (stage == 0) {
        std::printf("%-5s | %3d | %9.3f | %11.1f%% | %11.1f%% | %11.1f%% | %9d\n", name, M, wall,
                    100.0 * (P - 1) / (M + P - 1), 100.0 * mean, 100.0 * worst, in_flight);
      }
    }
  }
  pp.reset();
  MPI_Finalize();
  return 0;
}
