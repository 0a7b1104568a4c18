// `berth train CONFIG [--set section.key=value]...`
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>

#include "launcher/commands.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/config/config.h"
#include "runtime/core/check.h"
#include "runtime/core/decimal.h"
#include "runtime/core/log.h"
#include "runtime/train/lease_keeper.h"
#include "runtime/train/stop_signals.h"
#include "runtime/train/trainer.h"

#if BERTH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace berth {

std::string version_text() {
#if BERTH_CUDA
  const int n = cuda::device_count();
  return fmt::format("berth {} (CUDA: built, {} device{} visible)", BERTH_VERSION, n,
                     n == 1 ? "" : "s");
#else
  return fmt::format("berth {} (CUDA: not built)", BERTH_VERSION);
#endif
}

CLI::Validator whole_number_in(int64_t lo, int64_t hi) {
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        int64_t v = 0;  // out of range of 64 bits: refused, not saturated
        const bool parsed = parse_whole_number(value, &v);
        if (parsed && v >= lo && v <= hi) return "";
        if (hi != kAny) return fmt::format("{} is not a whole number in [{}, {}]", value, lo, hi);
        // Digits alone that did not parse are past 64 bits: "99999999999999999999 is not a
        // whole number >= 1" said it was no whole number.
        if (!parsed && lo != std::numeric_limits<int64_t>::min() && !value.empty() &&
            value[0] != '0' && value.find_first_not_of("0123456789") == std::string::npos) {
          return fmt::format("{} is beyond the whole numbers of 64 bits (at most {})", value,
                             std::numeric_limits<int64_t>::max());
        }
        return lo == std::numeric_limits<int64_t>::min()
                   ? value + " is not a whole number of 64 bits"
                   : fmt::format("{} is not a whole number >= {}", value, lo);
      },
      hi != kAny ? fmt::format("INT in [{}, {}]", lo, hi)
      : lo == 1  ? "INT>=1"
                 : "INT",
      lo == 1 && hi == kAny ? "POSITIVE_INTEGER" : "WHOLE_NUMBER");
}

CLI::Validator non_empty(const std::string& if_empty, const std::string& type_name) {
  return CLI::Validator(
      [if_empty](const std::string& v) -> std::string {
        return v.empty() ? "empty: " + if_empty : "";
      },
      type_name);
}

CLI::Validator whole_number_at_least(int64_t lo) {
  return whole_number_in(lo, std::numeric_limits<int64_t>::max());
}

CLI::Validator positive_integer() { return whole_number_at_least(1); }

long slurm_step_tasks() {
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (tasks == nullptr) return 0;
  char* end = nullptr;
  const long n = std::strtol(tasks, &end, 10);
  return end == tasks ? 0 : n;
}

CLI::Validator number_in(double lo, double hi, bool above_lo) {
  const std::string range = fmt::format("{}{}, {}]", above_lo ? "(" : "[", lo, hi);
  return CLI::Validator(
      [lo, hi, above_lo, range](std::string& value) -> std::string {
        double v = 0;
        if (read_decimal(value, &v) == value.size() && !value.empty() &&
            (above_lo ? v > lo : v >= lo) && v <= hi) {
          return "";
        }
        return fmt::format("{} is not a number in {}", value, range);
      },
      "NUMBER in " + range, "NUMBER_IN");
}

namespace {

// One start-up vote, a collective every rank reaches whether its step failed or not: each rank's
// `error` (empty: none) and `value`. When no rank failed it returns whether `value` is the same on
// every rank. Otherwise an error every rank shares is printed once, by rank 0, ending "(on all W
// ranks)", and one of some ranks only by each of them (`others_failed` on rank 0 when it did not
// fail), and all ranks exit together (ExitStatus, no MPI_Abort).
bool vote_at_start(const std::string& error, uint64_t value, int rank, int world,
                   const char* others_failed) {
  const uint64_t mine[3] = {error.empty() ? 0u : 1u,
                            error.empty() ? 0u : std::hash<std::string>{}(error), value};
  uint64_t lo[3], hi[3];
  {
    const WatchedCall call(
        "all_reduce of the start-up config vote (does every rank run `berth "
        "train`?)",
        sizeof mine, world);
    MPI_Allreduce(mine, lo, 3, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(mine, hi, 3, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  }
  if (hi[0] == 0) return lo[2] == hi[2];
  const bool alike = lo[0] == 1 && lo[1] == hi[1];
  if (!error.empty() && (!alike || rank == 0)) {
    log_error("{}{}", error, alike && world > 1 ? fmt::format(" (on all {} ranks)", world) : "");
  }
  if (!alike && rank == 0 && error.empty()) log_error("{}", others_failed);
  install_comm_watchdog(nullptr);
  throw ExitStatus{kExitError};
}

// srun without MPI wire-up (a missing or wrong --mpi= plugin) starts each of its tasks as a world
// of its own: each would train alone, with a global batch of its own, into one run directory (one
// task trained everything with dp 1, the other stopped at the run directory's lock). srun sets
// SLURM_STEP_NUM_TASKS for its tasks (a batch script's own shell has none); mpirun sets
// OMPI_COMM_WORLD_SIZE, so `mpirun -np 1` inside a bigger allocation is not refused.
void refuse_unwired_srun_tasks() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return;
  const long n = slurm_step_tasks();
  if (n <= 1) return;
  const char* id = std::getenv("SLURM_PROCID");
  BERTH_FAIL(
      "srun started {} tasks (SLURM_STEP_NUM_TASKS) but MPI sees this one (SLURM_PROCID {}) "
      "alone, in a world of 1: srun did not wire the tasks up, and each would train on its own. "
      "Launch with `srun --mpi=pmix` (`srun --mpi=list` shows what this Slurm offers), or with "
      "mpirun inside the allocation",
      n, id != nullptr ? id : "?");
}

// load_config, then check_layout and check_data_files, on every rank, with one report each
// (vote_at_start): every rank reads the same file, so a bad config, a layout the ranks cannot run
// or a missing dataset (the commonest mistake: it ended in MPI_Abort's banner) fails on all of
// them alike. The layout is checked only where every rank loaded the same config: configs that
// differ are the trainer's to report, naming the keys (a layout error of one side would hide them).
RunConfig load_config_on_every_rank(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world == 1) {
    refuse_unwired_srun_tasks();
    RunConfig cfg = load_config(path, overrides);
    naming_overrides(overrides, [&] {
      check_layout(cfg, world);
      check_data_files(cfg);
    });
    return cfg;
  }
  std::optional<RunConfig> cfg;
  std::string error;
  try {
    cfg = load_config(path, overrides);
  } catch (const Error& e) {
    error = e.what();
  }
  // The vote is the run's first collective: a rank that never comes (an MPMD launch whose other
  // program is not `berth train`) is ended by the watchdog, at this rank's comm_timeout_s (the
  // default when its config did not load), instead of waiting forever.
  install_comm_watchdog(cfg ? cfg->parallel.comm_timeout_s : RunConfig().parallel.comm_timeout_s,
                        kExitCommTimeout);
  const uint64_t config_hash = cfg ? std::hash<std::string>{}(config_to_toml(*cfg)) : 0;
  const bool same = vote_at_start(error, config_hash, rank, world,
                                  "the config loaded here but not on every rank: each failing "
                                  "rank prints why");
  if (same) {
    try {
      check_layout(*cfg, world);
      check_data_files(*cfg);
    } catch (const Error& e) {
      error = with_overrides_named(e.what(), overrides);
    }
    vote_at_start(error, 0, rank, world,
                  "the layout and the data files check out here but not on every rank: each "
                  "failing rank prints why");
  }
  return std::move(*cfg);
}

}  // namespace

void register_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;
    int64_t reservation = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config, "Run config (TOML), e.g. configs/tiny.toml")->required();
  cmd->add_option("--set", args->overrides,
                  "Override a config value: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint: a step-N directory, or 'auto' for the newest "
                  "complete one in checkpoint.dir")
      ->type_name("auto|PATH")
      // "--resume \"$CKPT\"" with CKPT unset trained from step 0 without a word.
      ->check(non_empty("give a step-N checkpoint directory or 'auto', or leave --resume out to "
                        "start from step 0",
                        "auto|PATH"));
  cmd->add_option("--reservation", args->reservation,
                  "Train under this reservation's lease (sets reservation.id)")
      ->check(positive_integer());
  cmd->callback([args]() {
    // From the start: a signal while the config, data and checkpoint load (seconds for a big
    // model) stops the run before its first step, exit 6, instead of killing it (143).
    const StopSignals stop_signals;
    std::vector<std::string> overrides = args->overrides;
    if (args->reservation > 0)
      overrides.push_back(fmt::format("reservation.id={}", args->reservation));
    const RunConfig cfg = load_config_on_every_rank(args->config, overrides);
    install_comm_watchdog(cfg.parallel.comm_timeout_s, kExitCommTimeout);
    struct Uninstall {  // before the communicators and the CUDA runtime go away
      ~Uninstall() { install_comm_watchdog(nullptr); }
    } uninstall;
    std::unique_ptr<Communicator> world = make_mpi_world();
    // The trainer's checks name the config file, also for a value --set gave: naming_overrides.
    // (args->overrides: --reservation is not an override the user wrote.)
    const std::unique_ptr<Trainer> made = naming_overrides(args->overrides, [&] {
      return std::make_unique<Trainer>(cfg, *world, nullptr, args->resume);
    });
    Trainer& trainer = *made;
    try {
      naming_overrides(args->overrides, [&] { trainer.run(); });
    } catch (const LeaseRefused& e) {  // every rank throws it together: one says why
      if (world->rank() == 0) log_error("{}", e.what());
      throw ExitStatus{kExitLeaseLost};
    }
    if (trainer.outcome() == Trainer::Outcome::kWindowEnded) throw ExitStatus{kExitWindowEnded};
    if (trainer.outcome() == Trainer::Outcome::kLeaseLost) throw ExitStatus{kExitLeaseLost};
    if (trainer.outcome() == Trainer::Outcome::kSignalled) throw ExitStatus{kExitSignalled};
  });
}

}  // namespace berth
