#include "runtime/cluster/plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/core/backend.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"

namespace berth {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Layers of pipeline stage s of pp (the first L % pp stages get one more), as stage_layers.
int64_t layers_of(int64_t L, int64_t pp, int64_t s) { return L / pp + (s < L % pp ? 1 : 0); }

}  // namespace

HardwareProfile builtin_profile(const std::string& name) {
  // Vendor figures: dense bf16 peak, dense fp32 (no tensor cores), HBM bandwidth, capacity,
  // per-GPU NVLink and InfiniBand bus bandwidth (A100 SXM: NVLink 3, 200 Gb/s IB; H100/H200 SXM:
  // NVLink 4, 400 Gb/s IB), latency.
  struct Row {
    const char* name;
    double peak, fp32, mem_bw, capacity, intra, inter, latency, block_shared;
  };
  // Shared memory a block may opt in to: 163 KiB on compute capability 8.0, 227 KiB on 9.0.
  static const Row kGpus[] = {
      {"a100", 312e12, 19.5e12, 2.0e12, 80.0 * kGiB, 240e9, 24e9, 20e-6, 163 * 1024.0},
      {"h100", 989e12, 67e12, 3.35e12, 80.0 * kGiB, 360e9, 45e9, 15e-6, 227 * 1024.0},
      {"h200", 989e12, 67e12, 4.8e12, 141.0 * 1e9, 360e9, 45e9, 15e-6, 227 * 1024.0},
  };
  HardwareProfile h;
  h.name = name;
  h.source = "built-in";
  for (const Row& r : kGpus) {
    if (name != r.name) continue;
    h.peak_flops = r.peak;
    h.fp32_flops = r.fp32;
    h.mem_bandwidth = r.mem_bw;
    h.mem_capacity = r.capacity;
    h.intra_bandwidth = r.intra;
    h.inter_bandwidth = r.inter;
    h.latency_s = r.latency;
    h.block_shared_bytes = r.block_shared;
    h.matmul_efficiency = 0.55;  // an assumed GEMM share of peak, not measured here
    return h;
  }
  BERTH_CHECK(name == "cpu",
              "unknown hardware profile '{}': use a100, h100, h200, cpu or a profile file "
              "written by `berth plan --calibrate`",
              name);
  // A guess for one rank of a server CPU; `berth plan --calibrate` measures the real one.
  h.source = "built-in guess (run `berth plan --calibrate` for this machine's figures)";
  h.cpu = true;
  h.peak_flops = 100e9;
  h.matmul_efficiency = 1.0;
  h.mem_bandwidth = 10e9;
  h.mem_capacity = 16.0 * kGiB;
  h.intra_bandwidth = 5e9;
  h.inter_bandwidth = 1e9;
  h.latency_s = 5e-6;
  h.devices_per_node = 2;
  // The ring attention block kernel (context parallelism) runs far below the GEMMs: calibrated
  // at 2.9–4.9 GFLOP/s on the 2-core dev machine (2026-12-06), where its GEMMs reach 38–128. At
  // the peak it rated cp 2 as fast as dp 2 (a cp 2 step of 2.35 s planned at 0.38 s).
  h.block_attention_rate = 0.05 * h.peak_flops;
  return h;
}

std::string hardware_profile_json(const HardwareProfile& h) {
  auto pairs = [](const std::vector<std::pair<double, double>>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& [x, y] : v) a.push_back({x, y});
    return a;
  };
  const nlohmann::json rates = pairs(h.gemm_rates);
  const nlohmann::json j = {{"format", "berth-hardware-profile"},
                            {"name", h.name},
                            {"source", h.source},
                            {"cpu", h.cpu},
                            {"peak_flops", h.peak_flops},
                            {"fp32_flops", h.fp32_flops},
                            {"matmul_efficiency", h.matmul_efficiency},
                            {"gemm_rates", rates},
                            {"mem_bandwidth", h.mem_bandwidth},
                            {"attention_rates", pairs(h.attention_rates)},
                            {"block_attention_rate", h.block_attention_rate},
                            {"layernorm_s", h.layernorm_s},
                            {"gelu_s", h.gelu_s},
                            {"residual_s", h.residual_s},
                            {"crossentropy_s", h.crossentropy_s},
                            {"adamw_s", h.adamw_s},
                            {"grad_pass_s", h.grad_pass_s},
                            {"mem_capacity", h.mem_capacity},
                            {"intra_bandwidth", h.intra_bandwidth},
                            {"inter_bandwidth", h.inter_bandwidth},
                            {"latency_s", h.latency_s},
                            {"devices_per_node", h.devices_per_node},
                            {"block_shared_bytes", h.block_shared_bytes}};
  return j.dump(2) + "\n";
}

bool is_hardware_profile_file(const std::string& path) {
  std::error_code ec;
  // a profile is a few hundred bytes: a larger file (a dataset given by mistake) is not read
  if (!std::filesystem::is_regular_file(path, ec) ||
      std::filesystem::file_size(path, ec) > (size_t(1) << 20) || ec)
    return false;
  const nlohmann::json j = nlohmann::json::parse(read_text_file(path), nullptr, false);
  return j.is_object() && j.contains("format") && j["format"].is_string() &&
         j["format"].get<std::string>() == "berth-hardware-profile";
}

HardwareProfile read_hardware_profile(const std::string& path) {
  // A profile is a few KB of JSON: a larger file (a dataset given as --gpu) took 20 s and 4 GB
  // to read before it was refused.
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  BERTH_CHECK(ec || bytes <= (uintmax_t(1) << 20),
              "'{}' is {} bytes, not a hardware profile (a few KB of JSON, as `berth plan "
              "--calibrate` writes)",
              path, bytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    // (its message quotes the offending bytes, which may be binary)
    std::string why = e.what();
    for (char& c : why) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    }
    BERTH_FAIL("hardware profile '{}' is not valid JSON ({})", path, why);
  }
  BERTH_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                  j["format"].get<std::string>() == "berth-hardware-profile",
              "'{}' is not a hardware profile (a JSON object with format "
              "\"berth-hardware-profile\", as `berth plan --calibrate` writes)",
              path);
  // clang-format off
  static const char* kKeys[] = {"format", "name", "source", "cpu", "peak_flops", "fp32_flops",
                                "matmul_efficiency", "gemm_rates", "mem_bandwidth",
                                "mem_capacity", "intra_bandwidth", "inter_bandwidth",
                                "latency_s", "devices_per_node", "attention_rates",
                                "block_attention_rate", "layernorm_s", "gelu_s", "residual_s",
                                "crossentropy_s", "adamw_s", "grad_pass_s",
                                "block_shared_bytes"};
  // clang-format on
  for (const auto& [key, value] : j.items()) {
    BERTH_CHECK(std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) {
                  return key == k;
                }) != std::end(kKeys),
                "'{}': unknown key '{}'", path, key);
  }
  HardwareProfile h;
  // Every figure within what hardware can be (a rate of 1e-300 FLOP/s or a latency of 1e300 s
  // printed NaN and infinite step times, and `reserve --config` booked a one-minute window).
  auto number = [&](const char* key, double* out, double lo, double hi) {
    BERTH_CHECK(j.contains(key) && j[key].is_number(), "'{}': '{}' must be a number", path, key);
    *out = j[key].get<double>();
    BERTH_CHECK(*out >= lo && *out <= hi, "'{}': '{}' is {}, outside [{}, {}]", path, key, *out, lo,
                hi);
  };
  auto text = [&](const char* key, const std::string& otherwise) {
    if (!j.contains(key)) return otherwise;
    BERTH_CHECK(j[key].is_string(), "'{}': '{}' must be a string, got {}", path, key,
                j[key].dump());
    return j[key].get<std::string>();
  };
  constexpr double kMaxRate = 1e18, kMinRate = 1e3;  // FLOP/s and bytes/s
  h.name = text("name", "profile");
  h.source = text("source", path);
  if (j.contains("cpu")) {
    BERTH_CHECK(j["cpu"].is_boolean(), "'{}': 'cpu' must be true or false, got {}", path,
                j["cpu"].dump());
    h.cpu = j["cpu"].get<bool>();
  }
  // A rate that may be 0 (not measured, not known), else at least `lo`: a rate of 1e-300 would
  // print NaN step times.
  auto rate_or_unset = [&](const char* key, double* out, double lo) {
    if (!j.contains(key)) return;
    number(key, out, 0, kMaxRate);
    BERTH_CHECK(*out == 0 || *out >= lo, "'{}': '{}' is {}: 0 (not known) or at least {}", path,
                key, *out, lo);
  };
  number("peak_flops", &h.peak_flops, 1e6, kMaxRate);
  rate_or_unset("fp32_flops", &h.fp32_flops, 1e6);
  number("matmul_efficiency", &h.matmul_efficiency, 1e-3, 1);
  number("mem_bandwidth", &h.mem_bandwidth, kMinRate, kMaxRate);
  number("mem_capacity", &h.mem_capacity, 1 << 20, 1e15);
  number("intra_bandwidth", &h.intra_bandwidth, kMinRate, kMaxRate);
  number("inter_bandwidth", &h.inter_bandwidth, kMinRate, kMaxRate);
  number("latency_s", &h.latency_s, 0, 10);
  double per_node = 0;
  number("devices_per_node", &per_node, 1, 1024);
  BERTH_CHECK(per_node == std::floor(per_node),
              "'{}': 'devices_per_node' must be a whole number, "
              "got {}",
              path, per_node);
  h.devices_per_node = int(per_node);
  auto table = [&](const char* key, std::vector<std::pair<double, double>>* out) {
    if (!j.contains(key)) return;
    BERTH_CHECK(j[key].is_array(), "'{}': '{}' must be a list of [size, FLOP/s]", path, key);
    for (const auto& r : j[key]) {
      BERTH_CHECK(r.is_array() && r.size() == 2 && r[0].is_number() && r[1].is_number() &&
                      r[0].get<double>() > 0 && r[1].get<double>() >= kMinRate &&
                      r[1].get<double>() <= kMaxRate,
                  "'{}': every '{}' entry must be [size > 0, FLOP/s in [{}, {}]], got {}", path,
                  key, kMinRate, kMaxRate, r.dump());
      out->emplace_back(r[0].get<double>(), r[1].get<double>());
    }
    std::sort(out->begin(), out->end());
  };
  table("gemm_rates", &h.gemm_rates);
  table("attention_rates", &h.attention_rates);
  rate_or_unset("block_attention_rate", &h.block_attention_rate, kMinRate);
  for (auto [key, field] : {std::pair{"layernorm_s", &h.layernorm_s},
                            {"gelu_s", &h.gelu_s},
                            {"residual_s", &h.residual_s},
                            {"crossentropy_s", &h.crossentropy_s},
                            {"adamw_s", &h.adamw_s},
                            {"grad_pass_s", &h.grad_pass_s}}) {
    if (j.contains(key)) number(key, field, 0, 1e3);
  }
  if (j.contains("block_shared_bytes")) {
    number("block_shared_bytes", &h.block_shared_bytes, 0, 1 << 30);
  }
  return h;
}

ParamCounts count_params(const PlanModel& m, const PlanLayout& l) {
  const int64_t C = m.C, Vp = round_up(m.V, 128 * l.tp);
  const int64_t per_layer = 12 * C * C + 13 * C;
  ParamCounts p;
  p.embedding = m.V * C + m.maxT * C;
  p.total = p.embedding + m.L * per_layer + 2 * C;
  p.padded = p.total + (Vp - m.V) * C;
  for (int64_t s = 0; s < l.pp; ++s) {
    int64_t n = layers_of(m.L, l.pp, s) * per_layer;
    if (s == 0) n += Vp * C + m.maxT * C;
    if (s == l.pp - 1) n += 2 * C + (l.pp > 1 ? Vp * C : 0);
    p.per_stage.push_back(n);
  }
  return p;
}

double flops_per_token(const PlanModel& m, double T, double attn_sq_per_row, bool cpu) {
  const double C = double(m.C), Vp = double(round_up(m.V, 128));
  // Every non-embedding parameter (as the trainer's MFU counts them) and the tied LM head.
  const double matmul = double(m.L) * (12.0 * C * C + 13.0 * C) + 2.0 * C + Vp * C;
  const double sq = attn_sq_per_row > 0 ? attn_sq_per_row : T * T;
  // QKᵀ and attention·V: 2·2·C FLOPs per (query, key) pair and layer, ×3 for training.
  const double attention = 12.0 * double(m.L) * C * sq / T;
  return 6.0 * matmul + (cpu ? attention : attention / 2);
}

namespace {

// One rank's memory on pipeline stage s (tp rank 0), and the activation slots it holds.
MemoryBreakdown stage_memory(const PlanInput& in, const HardwareProfile& hw, int64_t s,
                             double* slots_out) {
  const PlanModel& m = in.model;
  const PlanLayout& l = in.layout;
  const double tp = double(l.tp), C = double(m.C), Cq = C / tp, F = 4 * C / tp;
  const double NHl = double(m.NH) / tp, Vpl = double(round_up(m.V, 128 * l.tp)) / tp;
  const double B = double(in.micro_batch_size), T = double(in.seq_len) / double(l.cp);
  const double N = B * T;
  const double Lk = double(layers_of(m.L, l.pp, s));
  const bool first = s == 0, last = s == l.pp - 1;
  // Parameters this rank holds (its tp slice of its stage).
  double P = Lk * (4 * C + 3 * Cq * C + 3 * Cq + C * Cq + C + F * C + F + C * F + C);
  if (first) P += Vpl * C + double(m.maxT) * C;
  if (last) P += 2 * C + (l.pp > 1 ? Vpl * C : 0);
  const double shards = l.zero == 1 ? double(l.dp * l.cp) : 1.0;
  const double range = std::ceil(P / shards);
  // Micro-batches in flight: 1F1B min(pp − s, M), AFAB M.
  const double M = double(l.microbatches);
  const double slots = l.pp == 1 ? 1.0 : (l.afab ? M : std::min(double(l.pp - s), M));
  *slots_out = slots;
  // Attention state per layer: the CPU kernels keep the probabilities (B·NH·T²) unless ring
  // attention (cp > 1) keeps the log-sum-exp; flash attention (GPU) keeps the log-sum-exp.
  const bool lse = l.cp > 1 || !hw.cpu;
  const double att = lse ? N * NHl : B * NHl * T * T;
  const double per_layer = 3 * N * C + 4 * N + 3 * N * Cq + N * Cq + att + 2 * N * F;
  double per_slot = (Lk + 1) * N * C + Lk * per_layer;
  if (last) per_slot += N * C + 4 * N + N * Vpl;
  double workspace = 3 * N * C + 3 * N * Cq + N * Cq + N * F + (lse ? 0 : att);
  if (!last) workspace += N * C;  // the gradient received from the next stage
  if (l.cp > 1) workspace += 6 * N * Cq;
  if (l.tp > 1 && last) workspace += 3 * N;  // vocabulary-parallel loss reductions
  MemoryBreakdown mb;
  // berth keeps everything in fp32 on either device: the parameters (the master weights), their
  // gradients, AdamW's moments (sharded with ZeRO-1) and the activations.
  const double act_bytes = 4;
  mb.params = 4 * P;
  mb.grads = 4 * P;
  mb.optimizer = 8 * range;
  mb.activations = act_bytes * slots * per_slot;
  mb.workspace = act_bytes * workspace;
  if (in.bf16) {  // the GEMM operands rounded to bf16: the largest activation, weight and output
                  // gradient, in bf16 on a GPU (fp32 on the CPU, which emulates the rounding)
    const double head = first || last ? Vpl * C : 0;
    const double largest =
        N * std::max(C, F) + std::max(F * C, head) + N * std::max({F, 3 * Cq, last ? Vpl : 0.0});
    mb.workspace += (hw.cpu ? 4 : 2) * largest;
  }
  if (l.zero == 1) mb.comm += 4 * range;  // the reduce-scatter's gradient shard
  if (l.cp > 1) mb.comm += act_bytes * 4 * N * Cq;  // K/V blocks on the ring
  // Batches: M micro-batches of tokens, targets, positions (int32), and their CP shards.
  mb.data = in.data_bytes + 4 * M * (3 * B * double(in.seq_len) + B + 1) +
            (l.cp > 1 ? 4 * M * 3 * N : 0);
  return mb;
}

// A measured table (ascending x → rate), interpolated in log x; clamped at its ends.
double interpolate(const std::vector<std::pair<double, double>>& r, double x) {
  if (x <= r.front().first) return r.front().second;
  if (x >= r.back().first) return r.back().second;
  for (size_t i = 1; i < r.size(); ++i) {
    if (x <= r[i].first) {
      const double t = std::log(x / r[i - 1].first) / std::log(r[i].first / r[i - 1].first);
      return r[i - 1].second + t * (r[i].second - r[i - 1].second);
    }
  }
  return r.back().second;
}

// Why berth would not run this model's attention on tensor cores, or "" where it would: in bf16
// on a GPU, where the tiled kernels take the head size and fit the profile's shared memory per
// block (tiled_attention_shared_bytes; the ring's blocks too).
std::string scalar_attention_reason(const PlanInput& in, const HardwareProfile& hw) {
  if (!in.bf16 || hw.cpu) return "fp32 run or CPU";
  const int64_t hs = in.model.NH > 0 ? in.model.C / in.model.NH : 0;
  if (in.model.C % std::max<int64_t>(in.model.NH, 1) != 0 || !tiled_attention_head_size(int(hs))) {
    std::string sizes;
    for (int t = 1; t <= 256; ++t)
      if (tiled_attention_head_size(t)) sizes += fmt::format("{}{}", sizes.empty() ? "" : ", ", t);
    return fmt::format("the tiled kernels take head sizes {}, not {}", sizes, hs);
  }
  const size_t need = tiled_attention_shared_bytes(int(hs));
  if (hw.block_shared_bytes > 0 && double(need) > hw.block_shared_bytes)
    return fmt::format(
        "head size {} needs {:.0f} KiB of shared memory per block, {} has {:.0f} KiB", hs,
        double(need) / 1024, hw.name, hw.block_shared_bytes / 1024);
  return "";
}
bool tensor_core_attention(const PlanInput& in, const HardwareProfile& hw) {
  return scalar_attention_reason(in, hw).empty();
}

// The peak a GEMM can reach: the profile's peak, except fp32 GEMMs on a GPU (no tensor cores:
// berth's fp32 mode keeps TF32 off), which reach the fp32 peak.
double gemm_peak(const HardwareProfile& hw, bool bf16) {
  return hw.cpu || bf16 || hw.fp32_flops <= 0 ? hw.peak_flops : hw.fp32_flops;
}

double gemm_rate(const HardwareProfile& hw, bool bf16, double M, double N, double K) {
  if (hw.gemm_rates.empty()) return gemm_peak(hw, bf16) * hw.matmul_efficiency;
  return interpolate(hw.gemm_rates, std::cbrt(std::max(1.0, M * N * K)));
}

// Seconds per element (forward + backward) of a memory-bound op that moves `bytes` per element:
// the calibrated figure, else bytes over the memory bandwidth.
double per_elem(double measured, double bytes, const HardwareProfile& hw) {
  return measured > 0 ? measured : bytes / hw.mem_bandwidth;
}

// Time of a GEMM of (M, N, K) and its two backward GEMMs.
double linear_s(const HardwareProfile& hw, bool bf16, double M, double N, double K) {
  return 3.0 * 2.0 * M * N * K / gemm_rate(hw, bf16, M, N, K);
}

// Ring all-reduce of `bytes` over g ranks at `bw` bytes/s.
double all_reduce_s(double bytes, double g, double bw, double latency) {
  if (g <= 1) return 0;
  return 2.0 * (g - 1) / g * bytes / bw + 2.0 * (g - 1) * latency;
}

}  // namespace

std::string layout_invalid_reason(const PlanInput& in) {
  const PlanModel& m = in.model;
  const PlanLayout& l = in.layout;
  if (m.NH % l.tp != 0) return fmt::format("n_head ({}) is not divisible by tp ({})", m.NH, l.tp);
  if (l.pp > m.L) return fmt::format("pp ({}) > n_layer ({})", l.pp, m.L);
  if (in.seq_len % (2 * l.cp) != 0 && l.cp > 1) {
    return fmt::format("seq_len ({}) is not divisible by 2·cp ({})", in.seq_len, 2 * l.cp);
  }
  if (in.pack_align > 0 && in.pack_align % (2 * l.cp) != 0 && l.cp > 1) {
    return fmt::format("data.pack_align ({}) is not a multiple of 2·cp ({})", in.pack_align,
                       2 * l.cp);
  }
  return "";
}

Plan make_plan(const PlanInput& in, const HardwareProfile& hw) {
  const PlanModel& m = in.model;
  const PlanLayout& l = in.layout;
  BERTH_CHECK(m.L > 0 && m.NH > 0 && m.C > 0 && m.V > 0 && in.seq_len > 0 &&
                  in.micro_batch_size > 0 && l.microbatches > 0,
              "plan: the model and batch sizes must be positive");
  // Without it an fp32 plan took the bf16 tensor-core peak while saying "no tensor cores" (a
  // GPU's fp32 rate is a fraction of it: 67 of 989 TFLOP/s on an H100). So did the fp32
  // attention of a bf16 plan (a head size the tiled kernels do not take).
  BERTH_CHECK(hw.cpu || hw.fp32_flops > 0 || tensor_core_attention(in, hw),
              "hardware profile {} ({}) has no 'fp32_flops', the GPU's FLOP/s without tensor "
              "cores, which this plan needs ({}; TF32 is off): add it to the profile{}",
              hw.name, hw.source,
              in.bf16 ? scalar_attention_reason(in, hw) + ": attention runs the fp32 kernels"
                      : std::string("run.precision = \"fp32\""),
              in.bf16 ? "" : ", or plan with --set run.precision=bf16");
  Plan p;
  p.input = in;
  p.hw = hw;
  p.params = count_params(m, l);
  const double T = double(in.seq_len);
  const double sq = in.attn_sq_per_row > 0 ? in.attn_sq_per_row : T * T;
  p.flops_per_token = flops_per_token(m, T, sq, hw.cpu);
  p.tokens_per_step = double(l.dp * l.microbatches * in.micro_batch_size) * T *
                      (in.token_fill > 0 ? in.token_fill : 1.0);
  p.flops_per_step = p.flops_per_token * p.tokens_per_step;
  p.flops_total = p.flops_per_step * double(in.steps);

  std::string why = layout_invalid_reason(in);
  const int64_t eval_rows = in.eval_batches * l.dp * in.micro_batch_size;
  const int64_t val_rows = in.val_rows(l.cp);
  if (why.empty() && val_rows >= 0 && eval_rows > val_rows) {
    const int64_t batch = l.dp * in.micro_batch_size;
    why = fmt::format(
        "an evaluation reads eval.batches {} × dp {} × micro_batch_size {} = {} rows of data.val, "
        "which holds {} (berth train refuses it: {})",
        in.eval_batches, l.dp, in.micro_batch_size, eval_rows, val_rows,
        val_rows < batch ? fmt::format("fewer than one global batch of {}; give a bigger data.val, "
                                       "or lower train.micro_batch_size",
                                       batch)
                         : fmt::format("lower eval.batches to at most {}", val_rows / batch));
  }

  // Memory per stage; the peak is the largest.
  for (int64_t s = 0; s < l.pp; ++s) {
    double slots = 0;
    p.stage_memory.push_back(stage_memory(in, hw, s, &slots));
    if (s == 0 || p.stage_memory.back().total() > p.peak.total()) {
      p.peak = p.stage_memory.back();
      p.peak_stage = int(s);
      p.activation_slots = slots;
    }
  }
  {
    // (rank 0's slice as it holds it: wpe and the LayerNorms whole)
    const double full = double(p.params.padded), local = p.stage_memory[0].params / 4;
    p.checkpoint_gather_bytes = 4 * (4 * full + 2 * local);  // params, m, v, a repad copy; moments
    // A rank copies its moments whole: every rank without ZeRO; with ZeRO-1 the ranks of
    // dp = cp = 0, where the shards meet (the others copy only their shards). Counting the whole
    // copy on every rank is the most any rank holds, so a host of such ranks fits too (rank 0's
    // host has them). Rank 0 also holds the whole tensors. Measured on the CPU: 1.13 GiB more RSS
    // during a save of a 50.7 M-parameter model on one rank, as 24 bytes a parameter gives.
    if (hw.cpu && in.saves_checkpoints) {
      const double n = double(std::clamp<int64_t>(l.world(), 1, hw.devices_per_node));
      p.save_share_bytes = p.peak.total() + 8 * local + 16 * full / n;
    }
  }
  if (why.empty() && p.peak.total() > hw.mem_capacity) {
    why = fmt::format("stage {} needs {} per device, more than the {} of a device",
                      p.peak_stage, format_bytes(p.peak.total()), format_bytes(hw.mem_capacity));
  }
  if (why.empty() && p.save_share_bytes > hw.mem_capacity) {
    why = fmt::format(
        "a checkpoint save needs {} per device (the peak {} + the whole tensors rank 0 gathers and "
        "each rank's moments{}), more than the {} of a device",
        format_bytes(p.save_share_bytes), format_bytes(p.peak.total()),
        hw.devices_per_node > 1 && l.world() > 1 ? ", shared by the host's ranks" : "",
        format_bytes(hw.mem_capacity));
  }

  // Step time on the critical path: the slowest stage's micro-batch time × (M + pp − 1), plus
  // the data-parallel gradient reduction and the optimizer.
  const double B = double(in.micro_batch_size), Tl = T / double(l.cp), N = B * Tl;
  const double C = double(m.C), tp = double(l.tp), NHl = double(m.NH) / tp;
  const double HS = C / double(m.NH), Vpl = double(round_up(m.V, 128 * l.tp)) / tp;
  const double act_bytes = 4;  // berth's activations are fp32 on either device
  const bool tp_intra = l.tp <= hw.devices_per_node;
  const double tp_bw = tp_intra ? hw.intra_bandwidth : hw.inter_bandwidth;
  const double cp_bw = l.tp * l.cp <= hw.devices_per_node ? hw.intra_bandwidth : hw.inter_bandwidth;
  const double pp_bw = l.tp * l.cp * l.pp <= hw.devices_per_node ? hw.intra_bandwidth
                                                                   : hw.inter_bandwidth;
  const double dp_bw = l.world() <= hw.devices_per_node ? hw.intra_bandwidth : hw.inter_bandwidth;
  // Seconds per element of the memory-bound ops, forward + backward (fp32 passes).
  const double a = act_bytes;
  const double t_ln = per_elem(hw.layernorm_s, 6 * a, hw);
  const double t_gelu = per_elem(hw.gelu_s, 5 * a, hw);
  const double t_res = per_elem(hw.residual_s, 3 * a, hw);
  const double t_ce = per_elem(hw.crossentropy_s, 4 * a, hw);
  // Attention FLOPs of one micro-batch and layer on this rank: QKᵀ and P·V over the attended
  // (query, key) pairs, ×3 for training; the CPU kernels compute whole blocks.
  const double doc = sq / T;  // the typical document length
  const double pairs = B * sq / double(l.cp) / (hw.cpu ? 1.0 : 2.0);
  const double attn_flops = 3.0 * 2.0 * 2.0 * pairs * HS * NHl;
  // berth's attention kernels: in bf16 on a GPU, the tiled tensor-core kernels (head sizes of
  // tiled_attention_head_size; the ring's blocks too) at the bf16 peak × the GEMM share; otherwise
  // fp32 kernels (no tensor cores) at the fp32 peak × the GEMM share. Both are upper bounds.
  const bool tc_attention = tensor_core_attention(in, hw);
  double attn_rate = gemm_peak(hw, tc_attention) * hw.matmul_efficiency;
  if (l.cp > 1 && hw.block_attention_rate > 0) {
    attn_rate = hw.block_attention_rate;  // the ring's block kernel
  } else if (!hw.attention_rates.empty()) {
    attn_rate = interpolate(hw.attention_rates, doc);
  } else if (!hw.gemm_rates.empty()) {
    attn_rate = gemm_rate(hw, tc_attention, doc, doc, HS);
  }
  double stage_max = 0, tp_max = 0, cp_max = 0;
  for (int64_t s = 0; s < l.pp; ++s) {
    const double Lk = double(layers_of(m.L, l.pp, s));
    // GEMMs of one layer: qkv, attention out, MLP up and down (each with its two backward ones).
    const bool b = in.bf16;
    double t = Lk * (linear_s(hw, b, N, 3 * C / tp, C) + linear_s(hw, b, N, C, C / tp) +
                     linear_s(hw, b, N, 4 * C / tp, C) + linear_s(hw, b, N, C, 4 * C / tp));
    t += Lk * attn_flops / attn_rate;
    // Memory-bound ops of a layer: two LayerNorms and two residual adds over (N, C), GELU over
    // this rank's (N, 4C/tp).
    t += Lk * (2 * N * C * (t_ln + t_res) + N * 4 * C / tp * t_gelu);
    if (s == l.pp - 1) {  // LM head and loss over this rank's vocabulary columns, final LayerNorm
      t += linear_s(hw, b, N, Vpl, C) + N * Vpl * t_ce + N * C * t_ln;
    }
    // Tensor parallelism: 2 all-reduces of (N, C) per layer forward, 2 backward, and the
    // embedding / LM head's.
    const double tp_bytes = (4 * Lk + 2) * act_bytes * N * C;
    const double tpc = all_reduce_s(tp_bytes / (4 * Lk + 2), tp, tp_bw, hw.latency_s) * (4 * Lk + 2);
    // Context parallelism: K and V travel cp − 1 hops per layer forward, K, V, dK, dV backward.
    const double cp_bytes = Lk * double(l.cp - 1) * 6.0 * act_bytes * N * C / tp;
    const double cpc = l.cp > 1 ? cp_bytes / cp_bw + Lk * 3.0 * double(l.cp - 1) * hw.latency_s : 0;
    if (t + tpc + cpc > stage_max + tp_max + cp_max) {
      stage_max = t;
      tp_max = tpc;
      cp_max = cpc;
      p.comm.tp = tp > 1 ? tp_bytes * double(l.microbatches) : 0;
      p.comm.cp = cp_bytes * double(l.microbatches);
    }
  }
  const double M = double(l.microbatches), pp = double(l.pp);
  p.step.compute = stage_max * M;
  p.step.tp_comm = tp_max * M;
  p.step.cp_comm = cp_max * M;
  p.step.bubble = (stage_max + tp_max + cp_max) * (pp - 1);
  const double act_msg = act_bytes * N * C;
  p.comm.pp = pp > 1 ? 2.0 * M * act_msg : 0;
  p.step.pp_comm = pp > 1 ? 2.0 * M * (act_msg / pp_bw + hw.latency_s) : 0;
  const double local_params = p.peak.params / 4;  // the peak stage's slice, as the rank holds it
  const double grad_bytes = 4.0 * local_params;
  p.comm.dp = l.dp * l.cp > 1 ? 2.0 * double(l.dp * l.cp - 1) / double(l.dp * l.cp) * grad_bytes : 0;
  p.step.dp_comm = all_reduce_s(grad_bytes, double(l.dp * l.cp), dp_bw, hw.latency_s);
  const double shards = l.zero == 1 ? double(l.dp * l.cp) : 1.0;
  // AdamW over this rank's shard (7 fp32 passes), and the gradient norm and zeroing over all.
  p.step.optimizer = local_params / shards * per_elem(hw.adamw_s, 28, hw) +
                     local_params * per_elem(hw.grad_pass_s, 8, hw);
  const double step_s = p.step.total();
  p.tokens_per_s = p.tokens_per_step / step_s;
  p.mfu = hw.peak_flops > 0 ? p.flops_per_token * p.tokens_per_s /
                                  (hw.peak_flops * double(l.world()))
                            : 0;
  p.total_s = step_s * double(in.steps);
  p.device_hours = p.total_s / 3600.0 * double(l.world());
  p.fits = why.empty();
  p.why_not = why;
  return p;
}

namespace {

// The divisors of n > 0, ascending.
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

std::vector<LayoutChoice> rank_layouts(const PlanInput& in, const HardwareProfile& hw,
                                       int64_t devices) {
  std::vector<LayoutChoice> out;
  const int64_t rows = in.layout.dp * in.layout.microbatches * in.micro_batch_size;
  // Every factorization of the devices (12 devices have tp 3 and pp 6 layouts, not only powers
  // of two), within what berth train runs.
  for (int64_t tp : divisors(devices)) {
    if (tp > hw.devices_per_node || in.model.NH % tp != 0) continue;
    for (int64_t pp : divisors(devices / tp)) {
      if (pp > in.model.L) break;
      for (int64_t cp : divisors(devices / (tp * pp))) {
        if (cp > 1 &&
            (in.seq_len % (2 * cp) != 0 || (in.pack_align > 0 && in.pack_align % (2 * cp) != 0))) {
          continue;
        }
        const int64_t dp = devices / (tp * pp * cp);
        if (rows % dp != 0) continue;  // the global batch must split over dp
        const int64_t per_dp = rows / dp;
        for (int64_t zero : {int64_t(0), int64_t(1)}) {
          if (zero == 1 && dp * cp == 1) continue;
          // The largest micro-batch that fits (fewest micro-batches), as a user would pick; of
          // none that fits, the one that needs least memory (it showed the worst split).
          LayoutChoice best;
          bool have = false;
          for (int64_t micro : divisors(per_dp)) {
            const int64_t mb = per_dp / micro;
            if (pp > 1 && micro < pp && per_dp >= pp) continue;  // keep the bubble bounded
            PlanInput x = in;
            x.layout = PlanLayout{tp, pp, cp, dp, zero, micro, in.layout.afab};
            x.micro_batch_size = mb;
            LayoutChoice c{x.layout, mb, make_plan(x, hw)};
            if (!have || (c.plan.fits && !best.plan.fits) ||
                (c.plan.fits && best.plan.fits && c.plan.tokens_per_s > best.plan.tokens_per_s) ||
                (!c.plan.fits && !best.plan.fits && c.plan.peak.total() < best.plan.peak.total())) {
              best = c;
              have = true;
            }
            if (c.plan.fits && pp == 1) break;  // more micro-batches only slow a fitting one
          }
          if (have) out.push_back(best);
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    if (a.plan.fits != b.plan.fits) return a.plan.fits;
    return a.plan.tokens_per_s > b.plan.tokens_per_s;
  });
  return out;
}

int64_t smallest_fitting_devices(const PlanInput& in, const HardwareProfile& hw,
                                 int64_t max_devices) {
  for (int64_t n = 1; n <= max_devices; n *= 2) {
    for (const LayoutChoice& c : rank_layouts(in, hw, n)) {
      if (c.plan.fits) return n;
    }
  }
  return 0;
}

std::string format_bytes(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:.1f} GiB", bytes / kGiB);
  if (bytes >= 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
  return fmt::format("{:.0f} KiB", bytes / 1024.0);
}

namespace {

std::string si(double v, const char* unit) {
  const char* prefix[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 8) {
    v /= 1000;
    ++i;
  }
  return fmt::format("{:.3g} {}{}", v, prefix[i], unit);
}

}  // namespace

std::string format_plan(const Plan& p, double price) {
  const PlanLayout& l = p.input.layout;
  std::string s;
  s += fmt::format("hardware: {} ({}): {} peak{}, {} memory per device\n", p.hw.name, p.hw.source,
                   si(p.hw.peak_flops, "FLOP/s"),
                   p.hw.cpu || p.hw.fp32_flops <= 0
                       ? std::string()
                       : fmt::format(" (bf16; fp32 {})", si(p.hw.fp32_flops, "FLOP/s")),
                   format_bytes(p.hw.mem_capacity));
  const std::string scalar_why = scalar_attention_reason(p.input, p.hw);
  s += fmt::format("precision: {} GEMMs{}{}; fp32 weights, gradients, moments and activations\n",
                   p.input.bf16 ? "bf16" : "fp32", scalar_why.empty() ? " and attention" : "",
                   p.hw.cpu ? (p.input.bf16 ? " (emulated)" : "")
                            : (p.input.bf16 ? " (tensor cores)" : " (no tensor cores: TF32 off)"));
  if (p.input.bf16 && !p.hw.cpu && !scalar_why.empty())
    s += fmt::format("  attention in fp32 without tensor cores: {}\n", scalar_why);
  const double n = double(p.params.total);
  s += fmt::format("parameters: {} ({}; embeddings {}; padded as stored {})\n", p.params.total,
                   n >= 1e9 ? fmt::format("{:.2f} B", n / 1e9) : fmt::format("{:.2f} M", n / 1e6),
                   p.params.embedding, p.params.padded);
  for (size_t i = 0; i < p.params.per_stage.size() && l.pp > 1; ++i) {
    // (a rank's as the memory counts them: wpe and the LayerNorms are not split over tp)
    s += fmt::format("  stage {}: {} parameters ({} per tp rank)\n", i, p.params.per_stage[i],
                     int64_t(std::llround(p.stage_memory[i].params / 4)));
  }
  const double slots = double(l.dp * l.microbatches * p.input.micro_batch_size * p.input.seq_len);
  s += fmt::format(
      "FLOPs: {} per token, {} per step ({} tokens{}), {} for {} steps\n",
      si(p.flops_per_token, "FLOP"), si(p.flops_per_step, "FLOP"), int64_t(p.tokens_per_step),
      p.tokens_per_step < slots ? fmt::format(" of documents in {:.0f} row slots, {:.1f} % filled",
                                              slots, 100 * p.tokens_per_step / slots)
                                : "",
      si(p.flops_total, "FLOP"), p.input.steps);
  s += fmt::format("layout: tp={} pp={} cp={} dp={} ZeRO-{} microbatches={} micro_batch_size={} "
                   "({} devices)\n",
                   l.tp, l.pp, l.cp, l.dp, l.zero, l.microbatches, p.input.micro_batch_size,
                   l.world());
  s += "memory per rank:\n";
  auto row = [&](const char* what, double v) { s += fmt::format("  {:<12} {:>10}\n", what, format_bytes(v)); };
  row("parameters", p.peak.params);
  row("gradients", p.peak.grads);
  row("optimizer", p.peak.optimizer);
  s += fmt::format("  {:<12} {:>10}  ({} micro-batch(es) in flight)\n", "activations",
                   format_bytes(p.peak.activations), p.activation_slots);
  row("workspace", p.peak.workspace);
  row("comm", p.peak.comm);
  row("data", p.peak.data);
  s += fmt::format("  {:<12} {:>10}  peak on stage {} (of {}), capacity {}\n", "total",
                   format_bytes(p.peak.total()), p.peak_stage, l.pp,
                   format_bytes(p.hw.mem_capacity));
  s += fmt::format("  a checkpoint save adds up to {} on rank 0 (whole tensors gathered){}\n",
                   format_bytes(p.checkpoint_gather_bytes),
                   p.save_share_bytes > 0 ? fmt::format(": {} per device during it, in host memory",
                                                        format_bytes(p.save_share_bytes))
                                          : std::string());
  s += fmt::format("communication per step and rank: tp {} | cp {} | pp {} | dp {}\n",
                   format_bytes(p.comm.tp), format_bytes(p.comm.cp), format_bytes(p.comm.pp),
                   format_bytes(p.comm.dp));
  s += fmt::format("step: {:.3f} s = compute {:.3f} + tp {:.3f} + cp {:.3f} + pp {:.3f} + dp {:.3f} "
                   "+ bubble {:.3f} + optimizer {:.3f} | {} tok/s | MFU {:.0f}%\n",
                   p.step.total(), p.step.compute, p.step.tp_comm, p.step.cp_comm,
                   p.step.pp_comm, p.step.dp_comm, p.step.bubble, p.step.optimizer,
                   si(p.tokens_per_s, ""), 100 * p.mfu);
  s += fmt::format("run: {} steps in {} ({:.1f} device-hours)", p.input.steps,
                   format_duration(p.total_s), p.device_hours);
  if (price > 0) s += fmt::format(", cost {:.2f} at {:.2f} per device-hour", p.device_hours * price, price);
  s += "\n";
  for (const std::string& note : p.input.notes) s += fmt::format("note: {}\n", note);
  s += p.fits ? "fits\n" : fmt::format("does not fit: {}\n", p.why_not);
  return s;
}

std::string plan_to_json(const Plan& p, double price, const std::vector<LayoutChoice>& layouts,
                         int64_t smallest) {
  using nlohmann::json;
  auto mem = [](const MemoryBreakdown& m) {
    return json{{"params", m.params},         {"grads", m.grads},
                {"optimizer", m.optimizer},   {"activations", m.activations},
                {"workspace", m.workspace},   {"comm", m.comm},
                {"data", m.data},             {"total", m.total()}};
  };
  auto layout = [](const PlanLayout& l, int64_t mb) {
    return json{{"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"dp", l.dp}, {"zero", l.zero},
                {"microbatches", l.microbatches}, {"micro_batch_size", mb}};
  };
  json j;
  j["hardware"] = {{"name", p.hw.name},
                   {"source", p.hw.source},
                   {"peak_flops", p.hw.peak_flops},
                   {"fp32_flops", p.hw.fp32_flops},
                   {"mem_capacity", p.hw.mem_capacity}};
  j["precision"] = p.input.bf16 ? "bf16" : "fp32";
  const std::string scalar_why = scalar_attention_reason(p.input, p.hw);
  j["attention"] = {{"tensor_cores", scalar_why.empty()}};
  if (p.input.bf16 && !p.hw.cpu && !scalar_why.empty()) j["attention"]["why_not"] = scalar_why;
  j["params"] = {{"total", p.params.total}, {"embedding", p.params.embedding},
                 {"padded", p.params.padded}, {"per_stage", p.params.per_stage}};
  j["flops"] = {{"per_token", p.flops_per_token}, {"per_step", p.flops_per_step},
                {"total", p.flops_total}};
  j["layout"] = layout(p.input.layout, p.input.micro_batch_size);
  j["memory"] = {{"peak", mem(p.peak)},
                 {"peak_stage", p.peak_stage},
                 {"checkpoint_gather", p.checkpoint_gather_bytes},
                 {"save_share", p.save_share_bytes},
                 {"activation_slots", p.activation_slots}};
  json stages = json::array();
  for (const MemoryBreakdown& m : p.stage_memory) stages.push_back(mem(m));
  j["memory"]["stages"] = stages;
  j["comm_bytes_per_step"] = {{"tp", p.comm.tp}, {"cp", p.comm.cp}, {"pp", p.comm.pp},
                              {"dp", p.comm.dp}};
  j["step_s"] = {{"total", p.step.total()}, {"compute", p.step.compute},
                 {"tp", p.step.tp_comm},      {"cp", p.step.cp_comm},
                 {"pp", p.step.pp_comm},      {"dp", p.step.dp_comm},
                 {"bubble", p.step.bubble},   {"optimizer", p.step.optimizer}};
  j["tokens_per_s"] = p.tokens_per_s;
  j["mfu"] = p.mfu;
  j["total_s"] = p.total_s;
  j["device_hours"] = p.device_hours;
  if (price > 0) j["cost"] = p.device_hours * price;
  j["fits"] = p.fits;
  if (!p.fits) j["why_not"] = p.why_not;
  j["notes"] = p.input.notes;
  json ranked = json::array();
  for (const LayoutChoice& c : layouts) {
    json r = layout(c.layout, c.micro_batch_size);
    r["tokens_per_s"] = c.plan.tokens_per_s;
    r["peak_memory"] = c.plan.peak.total();
    r["fits"] = c.plan.fits;
    if (!c.plan.fits) r["why_not"] = c.plan.why_not;
    ranked.push_back(r);
  }
  j["layouts"] = ranked;
  // null when no count up to the search's limit fits (0 read as a count)
  j["smallest_devices"] = smallest > 0 ? json(smallest) : json(nullptr);
  return j.dump(2);
}

}  // namespace berth
