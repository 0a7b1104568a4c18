// `berth plan CONFIG [--gpus N] [--gpu h100|h200|a100|cpu|FILE] [--price-per-gpu-hour X] [--json]`
// and `berth plan --calibrate [--out FILE]` (docs/plan.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "launcher/commands.h"
#include "runtime/cluster/plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/config/config.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/train/preflight.h"

namespace berth {
namespace {

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t gpus = 0;
  std::string gpu = "cpu";
  double price = 0;
  bool json = false;
  bool calibrate = false;
  std::string out;
};

void calibrate(const PlanArgs& a) {
  std::unique_ptr<Communicator> world = make_mpi_world();
  // An --out of the user's goes into a directory that exists (a typo's were made); only the
  // default's (~/.local/share/berth/profiles) is created. Checked before the measuring, by the
  // rank that writes it.
  if (world->rank() == 0) {
    if (!a.out.empty()) check_output_file(a.out, "--out", "profile.json");
    // An earlier profile may be replaced; any other file (a config, a dataset) is not ours.
    const std::string path = a.out.empty() ? default_profile_path() : a.out;
    std::error_code ec;
    BERTH_CHECK(!std::filesystem::exists(path, ec) || is_hardware_profile_file(path),
                "{} '{}' exists and is not a hardware profile: calibrating would replace it; "
                "choose another name, or remove it first",
                a.out.empty() ? "the default profile path" : "--out", path);
  }
  const HardwareProfile h = calibrate_profile(*world);
  if (world->rank() != 0) return;
  const std::string path = a.out.empty() ? default_profile_path() : a.out;
  if (a.out.empty())
    ensure_writable_dir(std::filesystem::path(path).parent_path().string(), "profile directory");
  write_file_atomic(path, hardware_profile_json(h));
  std::printf("calibrated %s: sgemm", h.source.c_str());
  for (const auto& [size, rate] : h.gemm_rates) std::printf(" %.0f³ %.1f GFLOP/s", size, rate / 1e9);
  // --gpu cpu reads the default path only
  std::printf(
      "\n  memory bandwidth %.1f GB/s, all-reduce bus bandwidth %.2f GB/s, latency %.1f µs, "
      "%d rank(s) per host, %s per rank\nsaved %s (use it with %s--gpu %s)\n",
      h.mem_bandwidth / 1e9, h.intra_bandwidth / 1e9, h.latency_s * 1e6, h.devices_per_node,
      format_bytes(h.mem_capacity).c_str(), path.c_str(), a.out.empty() ? "--gpu cpu or " : "",
      path.c_str());
}

void plan(const PlanArgs& a) {
  BERTH_CHECK(!a.config.empty(), "berth plan needs a CONFIG (or --calibrate)");
  const RunConfig cfg = load_config(a.config, a.overrides);
  // The config's layout; with --gpus, dp = 0 is derived from it.
  const int64_t inner = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp;
  const int64_t devices = a.gpus > 0 ? a.gpus
                          : cfg.parallel.dp > 0 ? inner * cfg.parallel.dp
                                                : inner;
  std::string sharing;  // a calibrated CPU profile of another rank count, given this one's memory
  const HardwareProfile hw =
      profile_for_planned_devices(resolve_hardware_profile(a.gpu), devices, &sharing);
  PlanInput in = plan_input_from_config(cfg, devices);
  require_trainable(in);
  if (!sharing.empty()) in.notes.push_back(sharing);
  BERTH_CHECK(cfg.parallel.dp == 0 || in.layout.world() == devices,
              "the config's layout tp·pp·cp·dp = {}·{}·{}·{} = {} does not use --gpus {}: set "
              "parallel.dp = 0 to derive it, or plan for {} devices",
              in.layout.tp, in.layout.pp, in.layout.cp, in.layout.dp, in.layout.world(), devices,
              in.layout.world());
  BERTH_CHECK(in.layout.world() == devices,
              "the config's tp·pp·cp = {}·{}·{} = {} does not divide --gpus {}: plan for a "
              "multiple of {} devices, or set parallel.tp, pp and cp (e.g. --set parallel.tp=1) "
              "to a product that divides {}",
              in.layout.tp, in.layout.pp, in.layout.cp, inner, devices, inner, devices);
  // A layout berth train refuses is an error here too (it printed every figure, then "does not
  // fit", and exited 0); other layouts of the devices are ranked by `berth plan` with a valid one.
  if (const std::string why = layout_invalid_reason(in); !why.empty()) {
    BERTH_FAIL(
        "{}: the config's layout tp={} pp={} cp={} cannot run this model: {}; change "
        "parallel.tp, pp or cp (berth train refuses it too)",
        a.config, in.layout.tp, in.layout.pp, in.layout.cp, why);
  }
  const Plan p = make_plan(in, hw);
  const std::vector<LayoutChoice> ranked = rank_layouts(in, hw, devices);
  const int64_t smallest = smallest_fitting_devices(in, hw);
  if (a.json) {
    std::printf("%s\n", plan_to_json(p, a.price, ranked, smallest).c_str());
    return;
  }
  std::printf("plan for %s on %lld x %s\n%s", a.config.c_str(), static_cast<long long>(devices),
              hw.name.c_str(), format_plan(p, a.price).c_str());
  std::printf("\nlayouts of %lld devices (global batch %lld rows), fastest first:\n",
              static_cast<long long>(devices),
              static_cast<long long>(in.layout.dp * in.layout.microbatches * in.micro_batch_size));
  std::printf("  %3s %3s %3s %4s %4s %5s %5s | %12s | %10s | %s\n", "tp", "pp", "cp", "dp", "zero",
              "micro", "mbs", "tokens/s", "peak mem", "");
  int shown_fit = 0, shown_bad = 0;
  for (const LayoutChoice& c : ranked) {
    if (c.plan.fits ? shown_fit++ >= 8 : shown_bad++ >= 6) continue;
    const PlanLayout& l = c.layout;
    std::printf("  %3lld %3lld %3lld %4lld %4lld %5lld %5lld | %12.0f | %10s | %s\n",
                static_cast<long long>(l.tp), static_cast<long long>(l.pp),
                static_cast<long long>(l.cp), static_cast<long long>(l.dp),
                static_cast<long long>(l.zero), static_cast<long long>(l.microbatches),
                static_cast<long long>(c.micro_batch_size), c.plan.tokens_per_s,
                format_bytes(c.plan.peak.total()).c_str(),
                c.plan.fits ? "fits" : ("rejected: " + c.plan.why_not).c_str());
  }
  const int hidden = std::max(0, shown_fit - 8) + std::max(0, shown_bad - 6);
  if (hidden > 0) {
    std::printf("  ... %d more (%d that fit, %d rejected): --json lists every layout\n", hidden,
                std::max(0, shown_fit - 8), std::max(0, shown_bad - 6));
  }
  if (ranked.empty()) std::printf("  (none: the global batch does not split over %lld devices)\n",
                                  static_cast<long long>(devices));
  if (smallest > 0) {
    std::printf("smallest device count with a layout that fits: %lld\n",
                static_cast<long long>(smallest));
  } else {
    PlanInput no_eval = in;  // is it the evaluation's rows, which more devices cannot give?
    no_eval.val_rows_by_cp.clear();
    std::printf("%s\n",
                !in.val_rows_by_cp.empty() && smallest_fitting_devices(no_eval, hw) > 0
                    ? "no layout of up to 65536 devices fits: each one's evaluation reads more "
                      "rows of data.val than it holds (eval.batches × dp × micro_batch_size); "
                      "lower eval.batches or train.micro_batch_size, or give a bigger data.val"
                    : "no layout of up to 65536 devices fits this config's memory");
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Estimate parameters, FLOPs, per-rank memory, step time and cost of a config, and "
              "rank the parallel layouts that fit; or --calibrate this machine");
  // The options of a plan, which --calibrate does not take.
  const std::vector<CLI::Option*> plan_options = {
      cmd->add_option("config", a->config, "Run config (TOML)"),
      // One value an occurrence: `--set k=v CONFIG` took the config as a second override.
      cmd->add_option("--set", a->overrides, "Override a config value (repeatable)")
          ->type_name("KEY=VALUE")
          ->allow_extra_args(false),
      // As many as the layout search goes (rank_layouts' max_devices).
      cmd->add_option("--gpus", a->gpus, "Devices to plan for (default: the config's layout)")
          ->check(whole_number_in(1, 65536)),
      cmd->add_option("--gpu", a->gpu,
                      "Hardware profile: a100, h100, h200, cpu (this host's calibrated profile, "
                      "else a guess) or a profile file")
          ->type_name("NAME|FILE"),
      cmd->add_option("--price-per-gpu-hour", a->price, "Price of one device-hour, for the cost")
          ->check(number_in(0.0, 1e9)),
      cmd->add_flag("--json", a->json, "Print the plan as JSON")};
  cmd->add_flag("--calibrate", a->calibrate,
                "Measure this machine's GEMM rate, memory and MPI bandwidth (run it under mpirun "
                "with the ranks per host you will train with) and save a profile");
  CLI::Option* out = cmd->add_option("--out", a->out,
                                     "Where --calibrate saves the profile (default: "
                                     "~/.local/share/berth/profiles/<host>.json)")
                         ->check(non_empty("give a file, or leave --out out for the default "
                                           "profile",
                                           "FILE"));
  cmd->callback([a, plan_options, out]() {
    if (a->calibrate) {
      // A config given here would be ignored silently: measuring the machine does not read one.
      for (const CLI::Option* o : plan_options) {
        BERTH_CHECK(o->count() == 0,
                    "berth plan --calibrate measures this machine and takes no {} (it plans "
                    "nothing): run it alone, then `berth plan CONFIG --gpu cpu` plans with what "
                    "it measured",
                    o->get_name(false, true));
      }
      calibrate(*a);
    } else {
      BERTH_CHECK(out->count() == 0,
                  "--out is where --calibrate saves the profile; a plan prints to standard output "
                  "(add --json for JSON)");
      naming_overrides(a->overrides, [&] { plan(*a); });
    }
  });
}

}  // namespace berth
