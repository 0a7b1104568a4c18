// `berth eta replay TRACE.csv --meta META.json [--every N]`: replay a step-time trace through the
//   progress predictor; prints the prediction after the last row, or with --every N a CSV of the
//   predictions after every N rows.
// `berth eta bench DIR`: the protocol of shared/eta/README.md over DIR/index.json (berth vs the
//   linear and moving-average baselines).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <memory>

#include "launcher/commands.h"
#include "runtime/cluster/progress.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

struct ReplayArgs {
  std::string trace, meta;
  int64_t every = 0;
};

void run_replay(const ReplayArgs& a) {
  const auto rows = read_trace_csv(a.trace);
  const RunFacts facts = read_run_facts_json(a.meta);
  check_trace_in_session(rows, facts, a.trace, a.meta);
  ProgressPredictor pred(facts);
  if (a.every > 0)
    fmt::print(
        "rows,step,elapsed_s,predicted_total_s,predicted_remaining_s,low_s,high_s,lease_"
        "exceeded\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    pred.observe(rows[i]);
    const bool last = i + 1 == rows.size();
    if (a.every > 0 && ((i + 1) % static_cast<size_t>(a.every) == 0 || last)) {
      const Prediction p = pred.predict();
      fmt::print("{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{}\n", i + 1, rows[i].step,
                 pred.elapsed_s(), p.total_s, p.remaining_s, p.low_s, p.high_s,
                 p.lease_exceeded ? 1 : 0);
    }
  }
  if (a.every == 0) {
    const Prediction p = pred.predict();
    fmt::print("predicted_total_s={:.3f} predicted_remaining_s={:.3f} low_s={:.3f} high_s={:.3f}\n",
               p.total_s, p.remaining_s, p.low_s, p.high_s);
  }
}

void run_bench(const std::string& dir) {
  const auto rows = run_eta_bench(dir);
  fmt::print("eta bench over {} ({} queries per progress point: traces x 5 steps within +-0.5 %)\n",
             dir, rows.empty() ? 0 : rows.front().n);
  fmt::print("APE of total time (mean / P90 / worst), remaining-time MAPE, lease-flag agreement\n");
  fmt::print("{:>5} | {:>22} | {:>22} | {:>22} | {:>20} | {:>17}\n", "p", "berth", "linear",
             "moving-avg", "remaining b/l/m", "lease b/l/m");
  for (const auto& r : rows) {
    // n/a: no query had time remaining, or no run had a lease
    const std::string remaining =
        std::isnan(r.berth_rem_mape)
            ? fmt::format("{:>21}", "n/a")
            : fmt::format("{:5.1f} {:6.1f} {:6.1f}%", 100 * r.berth_rem_mape,
                          100 * r.linear_rem_mape, 100 * r.ma_rem_mape);
    const std::string lease =
        r.leased == 0 ? fmt::format("{:>15}", "n/a (no lease)")
                      : fmt::format("{:4.0f} {:4.0f} {:4.0f}%", 100 * r.berth_lease_agree,
                                    100 * r.linear_lease_agree, 100 * r.ma_lease_agree);
    fmt::print(
        "{:>4.0f}% | {:6.2f} {:6.2f} {:7.2f}% | {:6.2f} {:6.2f} {:7.2f}% | {:6.2f} {:6.2f} "
        "{:7.2f}% | {} | {}\n",
        100 * r.p, 100 * r.berth_mape, 100 * r.berth_p90, 100 * r.berth_worst, 100 * r.linear_mape,
        100 * r.linear_p90, 100 * r.linear_worst, 100 * r.ma_mape, 100 * r.ma_p90, 100 * r.ma_worst,
        remaining, lease);
  }
}

}  // namespace

void register_eta_commands(CLI::App& app) {
  CLI::App* eta =
      app.add_subcommand("eta", "Progress prediction: replay traces, benchmark the predictor");
  eta->require_subcommand(1);

  auto replay_args = std::make_shared<ReplayArgs>();
  CLI::App* replay =
      eta->add_subcommand("replay", "Replay a step-time trace through the predictor");
  replay->add_option("trace", replay_args->trace, "Trace CSV (step,duration_s,tokens,...)")
      ->required()
      ->check(CLI::ExistingFile);
  replay->add_option("--meta", replay_args->meta, "Run facts JSON (one object, as in index.json)")
      ->required()
      ->check(CLI::ExistingFile);
  replay->add_option("--every", replay_args->every, "Print a CSV of predictions after every N rows")
      ->check(whole_number_at_least(0));
  replay->callback([replay_args]() { run_replay(*replay_args); });

  auto dir = std::make_shared<std::string>();
  CLI::App* bench =
      eta->add_subcommand("bench", "Benchmark berth vs baselines over DIR/index.json");
  bench->add_option("dir", *dir, "Directory with index.json and the trace CSVs")
      ->required()
      ->check(CLI::ExistingDirectory);
  bench->callback([dir]() { run_bench(*dir); });
}

}  // namespace berth
