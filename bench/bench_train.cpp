// Training throughput of the CPU reference path: tokens/s, model FLOP/s and MFU, measured in one
// run next to this machine's OpenBLAS sgemm rate so the ratio is taken under the same conditions.
//
//   bench_train [--steps N] [--warmup N] [--only a|b]
//
// (a) L=4 C=256 NH=4 V=257 T=256 B=4      (b) GPT-2 124M: L=12 C=768 NH=12 V=50257, B=4 T=64
// A step is forward + backward + AdamW on random tokens. Model FLOPs per token are
// 6·(non-embedding params + Vp·C) + 12·L·T·C (attention counted for the full T×T block, not halved
// for causality — the CPU kernels compute the full block). MFU = model FLOP/s ÷ sgemm FLOP/s.
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "packing/packed_batch.h"
#include "runtime/model/gpt.h"
#include "runtime/train/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of `reps` sgemm calls on n×n matrices (C = A·B), in FLOP/s.
double sgemm_flops(int n, int reps) {
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : a) x = u(gen);
  for (auto& x : b) x = u(gen);
  double best = 0;
  for (int r = 0; r < reps; r++) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
    best = std::max(best, 2.0 * n * n * double(n) / seconds_since(t0));
  }
  return best;
}

struct Result {
  double tokens_per_s, flops_per_s, step_ms;
};

Result bench_model(const char* name, int L, int C, int NH, int V, int T, int B, int warmup,
                   int steps) {
  const berth::GPTConfig cfg = berth::make_gpt_config(L, NH, C, V, T);
  berth::GPT<float> model(cfg, B, T);
  model.init_weights(1337);
  berth::AdamW opt(model.layout(), berth::AdamWSettings{});
  berth::PackedBatch batch;
  berth::reset_rows(&batch, B, T);
  std::mt19937 gen(7);
  for (int i = 0; i < B * T; i++) {
    batch.tokens[size_t(i)] = int32_t(gen() % uint32_t(V));
    batch.targets[size_t(i)] = int32_t(gen() % uint32_t(V));
  }
  const double flops_per_token = berth::gpt_flops_per_token(cfg, T);
  auto step = [&]() {
    model.zero_grad();
    model.forward(batch);
    model.backward(batch, 1.f / float(B * T));
    const double norm = std::sqrt(berth::cpu::sum_squares(model.grads().data(),
                                                          int64_t(model.grads().size())));
    opt.step(model.params().data(), model.grads().data(), 1e-4, norm);
  };
  for (int i = 0; i < warmup; i++) step();
  std::vector<double> times;
  for (int i = 0; i < steps; i++) {
    const auto t0 = Clock::now();
    step();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  Result r{double(B * T) / median, flops_per_token * B * T / median, median * 1e3};
  std::printf("%-34s params %6.1f M | %7.1f MFLOP/tok | step %8.1f ms (median of %d) | "
              "%8.0f tok/s | %6.1f GFLOP/s\n",
              name, double(model.layout().total) / 1e6, flops_per_token / 1e6, r.step_ms, steps,
              r.tokens_per_s, r.flops_per_s / 1e9);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, warmup = 2;
  std::string only;
  CLI::App app{"Training throughput and MFU of the CPU reference path on two model shapes"};
  app.add_option("--steps", steps, "Timed steps of shape (a); shape (b) runs half as many")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "Untimed steps first")->check(CLI::Range(0, 1000));
  app.add_option("--only", only, "One shape only")->check(CLI::IsMember({"a", "b"}));
  CLI11_PARSE(app, argc, argv);
  std::printf("bench_train: %d OpenMP threads, %s\n", omp_get_max_threads(),
              openblas_get_config());
  // sgemm before and after the models; MFU uses the higher of the two (the conservative ratio).
  const double peak_before = sgemm_flops(2048, 5);
  std::vector<std::pair<std::string, Result>> results;
  if (only.empty() || only == "a") {
    results.emplace_back("(a)", bench_model("(a) L4 C256 NH4 V257 T256 B4", 4, 256, 4, 257, 256, 4,
                                            warmup, steps));
  }
  if (only.empty() || only == "b") {
    results.emplace_back("(b)", bench_model("(b) GPT-2 124M T64 B4", 12, 768, 12, 50257, 64, 4,
                                            warmup, std::max(1, steps / 2)));
  }
  const double peak_after = sgemm_flops(2048, 5);
  const double peak = std::max(peak_before, peak_after);
  std::printf("%-34s %.1f GFLOP/s before, %.1f GFLOP/s after the models (best of 5, 2048^3)\n",
              "OpenBLAS sgemm", peak_before / 1e9, peak_after / 1e9);
  for (const auto& [name, r] : results) {
    std::printf("%-34s MFU %.1f %% (model FLOP/s / %.1f GFLOP/s sgemm)\n", name.c_str(),
                100.0 * r.flops_per_s / peak, peak / 1e9);
  }
  return 0;
}
