#include "runtime/train/preflight.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "packing/plan_cache.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/packed_loader.h"
#include "runtime/train/step_metrics.h"

namespace berth {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Mean over the plan's rows of Σ over its pieces of length².
double packed_attn_sq(const PackPlan& plan) {
  if (plan.n_rows() == 0) return 0;
  double sum = 0;
  for (const Piece& p : plan.pieces) sum += double(p.length) * double(p.length);
  return sum / double(plan.n_rows());
}

// The share of the plan's row slots (rows × T) that hold document tokens.
double packed_fill(const PackPlan& plan, int64_t T) {
  if (plan.n_rows() == 0) return 0;
  double sum = 0;
  for (const Piece& p : plan.pieces) sum += double(p.length);
  return sum / (double(plan.n_rows()) * double(T));
}

}  // namespace

void check_data_settings(const RunConfig& cfg) {
  const std::string where = cfg.source.empty() ? "config" : cfg.source;
  BERTH_CHECK(!cfg.data.train.empty(),
              "{}: data.train is not set; point it at a dataset made by `berth data import`",
              where);
  BERTH_CHECK(cfg.eval.interval == 0 || !cfg.data.val.empty(),
              "{}: eval.interval is {} but data.val is not set; set data.val or eval.interval = 0",
              where, cfg.eval.interval);
}

PlanInput plan_input_from_config(const RunConfig& cfg, int64_t world, bool pack_when_absent) {
  PlanInput in;
  try {
    check_data_settings(cfg);
  } catch (const Error& e) {
    in.refusals.push_back(e.what());
  }
  in.model = PlanModel{cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model,
                       cfg.model.vocab_size, cfg.model.max_seq_len};
  in.seq_len = cfg.data.seq_len;
  in.micro_batch_size = cfg.train.micro_batch_size;
  in.steps = cfg.train.steps;
  in.bf16 = cfg.run.precision == "bf16";
  in.pack_align = cfg.data.mode == "stream" ? 0 : cfg.data.pack_align;
  in.saves_checkpoints = cfg.checkpoint.interval > 0 || cfg.checkpoint.final;
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
  // data.val is read only when something evaluates (the trainer skips it at eval.interval = 0).
  const std::string val = cfg.eval.interval > 0 ? cfg.data.val : std::string();
  for (const std::string& path : {cfg.data.train, val}) {
    if (path.empty()) continue;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      in.notes.push_back(fmt::format("dataset {} not found: its memory is not counted", path));
      continue;
    }
    const TokenDatasetShape shape = read_token_dataset_shape(path);
    // A plan that "fits" for a config berth train refuses at once misleads.
    if (shape.vocab_size > cfg.model.vocab_size) {
      in.refusals.push_back(fmt::format(
          "{} '{}' has vocab_size {} but model.vocab_size is {}: raise model.vocab_size to at "
          "least {}",
          path == cfg.data.train ? "data.train" : "data.val", path, shape.vocab_size,
          cfg.model.vocab_size, shape.vocab_size));
    }
    // The tokens, offsets and mask, and the loader's shuffled window order (int64 each).
    in.data_bytes += shape.memory_bytes() + 8.0 * double(std::max<int64_t>(0, (shape.n_tokens - 1) / T));
  }
  // Rows are packed only for a layout that can run: the packer refuses an alignment (2·cp) that
  // does not divide seq_len, which berth plan and train report as the layout's error instead.
  const bool packable = layout_invalid_reason(in).empty();
  // The rows one pass over data.val gives an evaluation, as the trainer's loader makes them (a
  // packed or padded val set is packed here: a pure function of its document lengths), for every
  // cp a layout may take (the divisors of seq_len / 2): its automatic alignment is 2·cp.
  if (std::error_code ec; !val.empty() && std::filesystem::exists(val, ec) && packable &&
                          (pack_when_absent || cfg.data.mode == "stream")) {
    in.eval_batches = cfg.eval.batches;
    if (cfg.data.mode == "stream") {
      const int64_t rows = std::max<int64_t>(0, read_token_dataset_shape(val).n_tokens - 1) / T;
      for (int64_t cp = 1; cp <= std::max<int64_t>(1, T / 2); ++cp) {
        if (cp == 1 || T % (2 * cp) == 0) in.val_rows_by_cp.emplace_back(cp, rows);
      }
    } else {
      const std::vector<int64_t> lengths =
          doc_lengths_from_offsets(read_token_dataset_offsets(val));
      std::vector<std::pair<int64_t, int64_t>> rows_by_align;  // packed once per alignment
      for (int64_t cp = 1; cp <= std::max<int64_t>(1, T / 2); ++cp) {
        if (cp > 1 && T % (2 * cp) != 0) continue;
        const PackOptions o = eval_pack_options(cfg, int(cp));
        if (T % o.align != 0) continue;  // a pack_align this cp cannot take: the layout says why
        auto known = std::find_if(rows_by_align.begin(), rows_by_align.end(),
                                  [&](const auto& a) { return a.first == o.align; });
        if (known == rows_by_align.end()) {
          rows_by_align.emplace_back(o.align, pack_documents(lengths, o).n_rows());
          known = rows_by_align.end() - 1;
        }
        in.val_rows_by_cp.emplace_back(cp, known->second);
      }
    }
  }
  // Packed and padded rows: the attention work (Σ L² a row) and the share of row slots that are
  // document tokens (padding is computed, not counted: berth train's tokens/s and MFU count only
  // document tokens), from the plan berth train would use: the cached one when it is this run's,
  // else packed here (a pure function of the document lengths and the options).
  std::error_code ec;
  const bool rows_packed =
      cfg.data.mode != "stream" && packable && std::filesystem::exists(cfg.data.train, ec);
  const PackOptions options = rows_packed ? pack_options(cfg, int(cfg.parallel.cp)) : PackOptions{};
  const std::string plan = rows_packed ? packed_plan_path(cfg, cfg.data.train, options) : "";
  if (rows_packed && (pack_when_absent || std::filesystem::exists(plan, ec))) {
    const std::vector<uint64_t> offsets = read_token_dataset_offsets(cfg.data.train);
    const std::vector<int64_t> lengths = doc_lengths_from_offsets(offsets);
    std::optional<PackPlan> mine;
    // The cached plan, and only this run's: a stale or damaged one is rebuilt by the trainer, so
    // it says nothing about this run (and must not stop the pre-flight).
    if (std::filesystem::exists(plan, ec)) {
      std::string why;
      try {
        std::string key;
        PackPlan p = read_plan(plan, &key);
        why = key != plan_key(offsets, options) ? stale_plan_reason(p, options)
                                                : plan_mismatch(p, lengths);
        if (why.empty()) mine = std::move(p);
      } catch (const Error& e) {
        why = e.what();
      }
      try {
        require_named_plan_is_this_runs(cfg, options, &offsets);
      } catch (const Error& e) {
        in.refusals.push_back(e.what());
        why.clear();
      }
      if (!why.empty()) {
        // as the trainer treats it: a plan it rebuilds, or a file that is no plan, refused (said
        // alone: the reader's "rebuild it with berth pack" is no advice for a file berth pack
        // refuses to replace)
        try {
          require_plan_destination(plan);
          in.notes.push_back(fmt::format(
              "packing plan {} is not this run's ({}): berth train rebuilds it{}", plan, why,
              pack_when_absent ? " (planned here with the packing it makes)" : ""));
        } catch (const Error& e) {
          in.refusals.push_back(e.what());
        }
      }
    } else if (!cfg.data.pack_plan.empty()) {
      // A plan path the config names, not there yet, is where berth train writes the plan: a
      // missing or read-only directory there is refused at start.
      try {
        check_output_file(plan, "data.pack_plan", "pack_plan.h5");
      } catch (const Error& e) {
        in.refusals.push_back(e.what());
      }
    }
    if (!mine && pack_when_absent) mine = pack_documents(lengths, options);
    if (mine) set_row_packing(&in, *mine);
  }
  return in;
}

void require_trainable(const PlanInput& in) {
  if (in.refusals.empty()) return;
  std::string all;
  for (const std::string& r : in.refusals) all += (all.empty() ? "" : "; ") + r;
  BERTH_FAIL("berth train refuses this config: {}", all);
}

void set_row_packing(PlanInput* in, const PackPlan& plan) {
  in->attn_sq_per_row = packed_attn_sq(plan);
  in->token_fill = packed_fill(plan, in->seq_len);
}

HardwareProfile profile_for_ranks_here(const HardwareProfile& hw, int64_t ranks,
                                       std::string* note) {
  note->clear();
  const bool guess = hw.cpu && hw.source == builtin_profile("cpu").source;
  const bool calibrated_here =
      hw.cpu && hw.source.rfind("berth plan --calibrate", 0) == 0 && hw.name == host_name();
  if (!(guess || calibrated_here) || ranks < 1 || hw.devices_per_node == ranks) return hw;
  HardwareProfile h = hw;
  h.devices_per_node = int(std::min<int64_t>(ranks, 1024));
  h.mem_capacity = host_capacity_gib_per_rank(h.devices_per_node) * 1073741824.0;
  if (guess) return h;  // its rates are a guess at any sharing
  *note = fmt::format(
      "the CPU profile was calibrated with {} rank(s) per host; for {} here each rank has {} of "
      "memory (not the profile's {}), but the kernel rates and step time are those measured with "
      "{}: recalibrate with `mpirun -np {} --bind-to none berth plan --calibrate`",
      hw.devices_per_node, ranks, format_bytes(h.mem_capacity), format_bytes(hw.mem_capacity),
      hw.devices_per_node, ranks);
  return h;
}

HardwareProfile profile_for_planned_devices(const HardwareProfile& hw, int64_t devices,
                                            std::string* note) {
  return profile_for_ranks_here(hw, std::min<int64_t>(devices, hw.devices_per_node), note);
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
    // The guess's rates, with this host's memory: a rank's share at the guess's ranks per host
    // (its fixed 16 GiB said "does not fit" where berth train trains, and the reverse on a
    // smaller host).
    HardwareProfile h = builtin_profile("cpu");
    h.mem_capacity = host_capacity_gib_per_rank(h.devices_per_node) * 1073741824.0;
    return h;
  }
  if (spec == "a100" || spec == "h100" || spec == "h200") return builtin_profile(spec);
  std::error_code ec;
  const bool looks_like_a_path = spec.find('/') != std::string::npos || spec.ends_with(".json");
  BERTH_CHECK(std::filesystem::exists(spec, ec) || !looks_like_a_path,
              "hardware profile file '{}' does not exist: check the path, or make one with "
              "`berth plan --calibrate --out {}`",
              spec, spec);
  BERTH_CHECK(std::filesystem::exists(spec, ec),
              "unknown hardware profile '{}': use a100, h100, h200, cpu or the path of a profile "
              "file written by `berth plan --calibrate`",
              spec);
  return read_hardware_profile(spec);
}

double busy_cores_between(const std::string& stat_before, const std::string& stat_after,
                          int cores) {
  auto times = [](const std::string& line, double* busy, double* total) {
    std::istringstream in(line);
    std::string label;
    if (!(in >> label) || label != "cpu") return false;
    std::vector<double> t;
    for (double x; in >> x;) t.push_back(x);
    if (t.size() < 4) return false;
    *total = 0;
    for (double x : t) *total += x;
    *busy = *total - t[3] - (t.size() > 4 ? t[4] : 0.0);  // less idle and iowait
    return true;
  };
  double b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (cores <= 0 || !times(stat_before, &b0, &t0) || !times(stat_after, &b1, &t1) || t1 <= t0)
    return -1;
  return std::max(0.0, (b1 - b0) / (t1 - t0)) * cores;
}

std::string busy_host_warning(double busy_cores, int cores) {
  if (cores <= 0 || busy_cores < 0.5 || busy_cores < 0.25 * cores) return "";
  return fmt::format(
      "other work kept {:.1f} of this host's {} core(s) busy while the ranks waited: the "
      "calibration measures only the share it leaves (plans from this profile would predict "
      "slower steps than an idle host runs); calibrate when the host is idle",
      busy_cores, cores);
}

HardwareProfile calibrate_profile(Communicator& world) {
  HardwareProfile h;
  h.cpu = true;
  h.name = host_name();
  const int threads = omp_get_max_threads();
  h.source = fmt::format("berth plan --calibrate on {} at {} ({} rank(s), {} OpenMP thread(s) each)",
                         host_name(), format_utc_minute(unix_now()), world.size(), threads);
  const LocalRank local = mpi_local_rank();
  warn_if_threads_oversubscribed(local, "this profile's figures would carry that slowdown");
  {  // other work on the host, over half a second in which every rank sleeps (a barrier spins)
    world.barrier();
    auto first_line = []() {
      std::ifstream in("/proc/stat");
      std::string line;
      std::getline(in, line);
      return line;
    };
    const std::string before = local.rank == 0 ? first_line() : std::string();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (local.rank == 0) {
      const std::string busy = busy_host_warning(
          busy_cores_between(before, first_line(), cpu::online_cores()), cpu::online_cores());
      if (!busy.empty()) log_warn("{}", busy);
    }
  }
  // berth's own kernels, timed as they run in a step (every rank at once, the slowest rank).
  auto slowest_s = [&](auto&& body, int reps) {
    body();  // warm-up
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) body();
    return world.all_reduce_value(seconds_since(t0) / reps, ReduceOp::MAX);
  };
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  // Linear layers: berth's matmul forward + backward (the GEMMs y = x·Wᵀ + b, dx = dy·W,
  // dW += dyᵀ·x and the bias sums) at N = IC = OC = n: 6n³ FLOPs.
  for (int n : {64, 128, 256, 512, 1024}) {
    const size_t e = size_t(n) * size_t(n);
    const std::vector<float> x = random(e), w = random(e), b = random(size_t(n)), dy = random(e);
    std::vector<float> y(e), dx(e), dw(e), db(static_cast<size_t>(n));
    const double flops = 6.0 * double(n) * n * n;
    const double t = slowest_s([&] {
      cpu::matmul_forward(y.data(), x.data(), w.data(), b.data(), n, n, n);
      cpu::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, n, n);
    }, std::max(3, int(3e9 / flops)));
    h.gemm_rates.emplace_back(double(n), flops / t);
    h.peak_flops = std::max(h.peak_flops, flops / t);
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
  {  // causal attention, forward + backward, one sequence of T tokens, 4 heads of 64
    const int C = 256, NH = 4;
    for (int T : {64, 256, 1024}) {
      const std::vector<float> qkv = random(size_t(T) * 3 * C), dout = random(size_t(T) * C);
      std::vector<float> out(size_t(T) * C), att(size_t(NH) * T * T), datt(att.size()),
          dqkv(qkv.size());
      const int32_t cu[2] = {0, T};
      const double t = slowest_s([&] {
        cpu::attention_forward(out.data(), att.data(), qkv.data(), cu, 1, C, NH);
        cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), cu,
                                1, C, NH);
      }, std::max(2, int(2e8 / (12.0 * T * T * C))));
      h.attention_rates.emplace_back(double(T), 12.0 * T * T * C / t);
    }
  }
  {  // the ring attention block kernel: 256 queries against 256 earlier keys, 4 heads of 64
    const int C = 256, NH = 4, n = 256;
    const std::vector<float> q = random(size_t(n) * C), k = random(q.size()), v = random(q.size()),
                             dout = random(q.size());
    std::vector<float> out(q.size()), lse(size_t(n) * NH), dq(q.size()), dk(q.size()), dv(q.size());
    std::vector<int32_t> seq(static_cast<size_t>(n), 0), qpos(static_cast<size_t>(n)),
        kpos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) qpos[size_t(i)] = n + i, kpos[size_t(i)] = i;
    const double t = slowest_s([&] {
      cpu::attention_block_forward(out.data(), lse.data(), q.data(), k.data(), v.data(),
                                   seq.data(), qpos.data(), seq.data(), kpos.data(), n, n, C, NH);
      cpu::attention_block_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                    lse.data(), q.data(), k.data(), v.data(), seq.data(),
                                    qpos.data(), seq.data(), kpos.data(), n, n, C, NH);
    }, 3);
    h.block_attention_rate = 12.0 * n * n * C / t;
  }
  {  // memory-bound ops, seconds per element of forward + backward
    const int N = 4096, C = 256;
    const size_t e = size_t(N) * C;
    const std::vector<float> x = random(e), d = random(e), w = random(size_t(C)), b = random(size_t(C));
    const size_t n_rows = static_cast<size_t>(N), n_cols = static_cast<size_t>(C);
    std::vector<float> y(e), dx(e), mean(n_rows), rstd(n_rows), dw(n_cols), db(n_cols);
    h.layernorm_s = slowest_s([&] {
      cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      cpu::layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
    }, 5) / double(e);
    h.gelu_s = slowest_s([&] {
      cpu::gelu_forward(y.data(), x.data(), int64_t(e));
      cpu::gelu_backward(dx.data(), x.data(), d.data(), int64_t(e));
    }, 5) / double(e);
    h.residual_s = slowest_s([&] { cpu::residual_forward(y.data(), x.data(), d.data(), int64_t(e)); },
                             5) / double(e);
    const int V = 8192, rows = 512;
    const std::vector<float> logits = random(size_t(rows) * V);
    std::vector<float> losses(static_cast<size_t>(rows)), dlogits(logits.size());
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) targets[size_t(i)] = (i * 131) % V;
    h.crossentropy_s = slowest_s([&] {
      cpu::crossentropy_forward(losses.data(), logits.data(), targets.data(), rows, V, V);
      cpu::crossentropy_backward(dlogits.data(), logits.data(), targets.data(), 1.f / rows, rows, V,
                                 V);
    }, 5) / double(logits.size());
    std::vector<float> p = random(e), g = random(e), m(e, 0.f), v2(e, 0.f);
    h.grad_pass_s = slowest_s([&] {
      std::fill(g.begin(), g.end(), 0.f);
      volatile double sq = cpu::sum_squares(p.data(), int64_t(e));
      (void)sq;
    }, 5) / double(e);
    h.adamw_s = slowest_s([&] {
      cpu::adamw_update(p.data(), g.data(), m.data(), v2.data(), int64_t(e), 1e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, 1.f, 1);
    }, 5) / double(e);
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
  h.devices_per_node = local.size;
  h.mem_capacity = host_capacity_gib_per_rank(local.size) * 1024.0 * 1024.0 * 1024.0;
  return h;
}

}  // namespace berth
