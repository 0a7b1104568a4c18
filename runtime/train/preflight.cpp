#include "runtime/train/preflight.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "packing/plan_cache.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/log.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/step_metrics.h"

namespace berth {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Mean over the plan's rows of Σ over its pieces of length².
double packed_attn_sq(const std::string& plan_path) {
  std::string key;
  const PackPlan plan = read_plan(plan_path, &key);
  if (plan.n_rows() == 0) return 0;
  double sum = 0;
  for (const Piece& p : plan.pieces) sum += double(p.length) * double(p.length);
  return sum / double(plan.n_rows());
}

}  // namespace

PlanInput plan_input_from_config(const RunConfig& cfg, int64_t world) {
  PlanInput in;
  in.model = PlanModel{cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model,
                       cfg.model.vocab_size, cfg.model.max_seq_len};
  in.seq_len = cfg.data.seq_len;
  in.micro_batch_size = cfg.train.micro_batch_size;
  in.steps = cfg.train.steps;
  PlanLayout& l = in.layout;
  l.tp = cfg.parallel.tp;
  l.pp = cfg.parallel.pp;
  l.cp = cfg.parallel.cp;
  const int64_t inner = l.tp * l.pp * l.cp;
  l.dp = cfg.parallel.dp > 0 ? cfg.parallel.dp : std::max<int64_t>(1, world / inner);
  l.zero = cfg.parallel.zero;
  l.microbatches = cfg.parallel.microbatches;
  l.afab = cfg.parallel.schedule == "afab";
  const int64_t T = cfg.data.seq_len;
  for (const std::string& path : {cfg.data.train, cfg.data.val}) {
    if (path.empty()) continue;
    const TokenDatasetShape shape = read_token_dataset_shape(path);
    // The tokens, offsets and mask, and the loader's shuffled window order (int64 each).
    in.data_bytes += shape.memory_bytes() + 8.0 * double(std::max<int64_t>(0, (shape.n_tokens - 1) / T));
  }
  if (cfg.data.mode == "packed" && !cfg.data.train.empty()) {
    const std::string plan = !cfg.data.pack_plan.empty()
                                 ? cfg.data.pack_plan
                                 : fmt::format("{}.plan-{}-T{}.h5", cfg.data.train,
                                               cfg.data.pack_algorithm, T);
    std::error_code ec;
    if (std::filesystem::exists(plan, ec)) in.attn_sq_per_row = packed_attn_sq(plan);
  }
  if (cfg.checkpoint.interval > 0) in.checkpoints = (in.steps - 1) / cfg.checkpoint.interval;
  if (cfg.checkpoint.final) in.checkpoints += 1;
  return in;
}

std::string default_profile_path() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg != nullptr && *xdg != '\0' ? std::string(xdg)
                           : home != nullptr              ? std::string(home) + "/.local/share"
                                                          : std::string(".");
  return base + "/berth/profiles/" + host_name() + ".json";
}

HardwareProfile resolve_hardware_profile(const std::string& spec) {
  if (spec == "cpu") {
    const std::string path = default_profile_path();
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return read_hardware_profile(path);
    return builtin_profile("cpu");
  }
  if (spec == "a100" || spec == "h100" || spec == "h200") return builtin_profile(spec);
  std::error_code ec;
  BERTH_CHECK(std::filesystem::exists(spec, ec),
              "unknown hardware profile '{}': use a100, h100, h200, cpu or the path of a profile "
              "file written by `berth plan --calibrate`",
              spec);
  return read_hardware_profile(spec);
}

HardwareProfile calibrate_profile(Communicator& world) {
  HardwareProfile h;
  h.cpu = true;
  h.name = host_name();
  const int threads = omp_get_max_threads();
  h.source = fmt::format("berth plan --calibrate on {} at {} ({} rank(s), {} OpenMP thread(s) each)",
                         host_name(), format_utc_minute(unix_now()), world.size(), threads);
  // GEMM rates: C = A·Bᵀ at a cube of each size, every rank at once; the slowest rank's rate.
  for (int n : {64, 128, 256, 512, 1024}) {
    std::vector<float> a(size_t(n) * size_t(n), 0.5f), b(a), c(a);
    cpu::gemm(false, true, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // warm-up
    const double flops = 2.0 * double(n) * n * n;
    const int reps = std::max(3, int(2e9 / flops));
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      cpu::gemm(false, true, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    }
    const double mine = flops * reps / seconds_since(t0);
    const double slowest = -world.all_reduce_value(-mine, ReduceOp::MAX);
    h.gemm_rates.emplace_back(double(n), slowest);
    h.peak_flops = std::max(h.peak_flops, slowest);
  }
  h.matmul_efficiency = 1.0;
  // Memory bandwidth: a[i] = b[i] + s·c[i] over 3 × 64 MiB (12 bytes per element moved).
  {
    const size_t n = size_t(16) << 20;
    std::vector<float> a(n, 1.f), b(n, 2.f), c(n, 3.f);
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    for (int r = 0; r < reps; ++r) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    }
    const double bw = 12.0 * double(n) * reps / seconds_since(t0);
    volatile float sink = a[n / 2];  // the stores are observed
    (void)sink;
    h.mem_bandwidth = -world.all_reduce_value(-bw, ReduceOp::MAX);
  }
  // Communication: all-reduce of 16 MiB (bus bandwidth 2(n−1)/n × bytes / time) and of 1 float
  // (latency, per step of the ring's 2(n−1)).
  if (world.size() > 1) {
    std::vector<float> buf(size_t(4) << 20, 1.f);
    world.all_reduce(buf.data(), buf.size(), ReduceOp::SUM);  // warm-up
    world.barrier();
    auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    for (int r = 0; r < reps; ++r) world.all_reduce(buf.data(), buf.size(), ReduceOp::SUM);
    const double n = world.size();
    const double t = world.all_reduce_value(seconds_since(t0) / reps, ReduceOp::MAX);
    h.intra_bandwidth = 2.0 * (n - 1) / n * 4.0 * double(buf.size()) / t;
    float one = 1.f;
    world.barrier();
    t0 = std::chrono::steady_clock::now();
    const int small = 200;
    for (int r = 0; r < small; ++r) world.all_reduce(&one, 1, ReduceOp::SUM);
    const double ts = world.all_reduce_value(seconds_since(t0) / small, ReduceOp::MAX);
    h.latency_s = ts / (2.0 * (n - 1));
  } else {
    h.intra_bandwidth = h.mem_bandwidth / 2;  // one rank: a copy through memory
    h.latency_s = 1e-6;
  }
  h.inter_bandwidth = h.intra_bandwidth;  // measured on this host only
  const LocalRank local = mpi_local_rank();
  h.devices_per_node = local.size;
  h.mem_capacity = host_capacity_gib_per_rank(local.size) * 1024.0 * 1024.0 * 1024.0;
  return h;
}

}  // namespace berth
