// berth: one binary for every command. main initializes MPI for the commands that use it (a
// singleton run works without mpirun), dispatches the CLI11 subcommand, and turns any berth::Error
// into a logged message with rank@host and a non-zero exit — MPI_Abort when other ranks could be
// left waiting.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "launcher/commands.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/io/hdf5_exit.h"

namespace {

// Under mpirun most failures are met by every rank alike (a layout that does not divide the
// ranks, a missing data file): rank 0 reports at once and its MPI_Abort ends the others while
// they wait here, so the message appears once. A failure of another rank alone (its GPU, a file
// missing on its node) is still reported, this much later.
constexpr auto kPeerReportDelay = std::chrono::milliseconds(500);

void wait_for_rank0_report(int rank, int world) {
  if (world > 1 && rank != 0) std::this_thread::sleep_for(kPeerReportDelay);
}

// The command word: the first argument that is not an option ("" for none: --help, --version).
std::string command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind('-', 0) != 0) return arg;
  }
  return "";
}

bool has_argument(int argc, char** argv, const std::string& wanted) {
  for (int i = 1; i < argc; ++i) {
    if (wanted == argv[i]) return true;
  }
  return false;
}

// MPI for `train` and `plan` (--calibrate measures over the ranks), and for any command a launcher
// started (mpirun sets OMPI_COMM_WORLD_SIZE, srun PMIX_RANK with PMIx or PMI_RANK with PMI-2, and
// SLURM_STEP_NUM_TASKS for a step of several tasks). The offline commands run without it when
// launched alone: Open MPI's singleton start-up failed past ~128 KiB of arguments ("Argument list
// too long" launching its orted), which `data import --format text notes/*.txt` of some 7500
// files reached, before berth said anything.
bool needs_mpi(int argc, char** argv) {
  for (const char* launched : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (std::getenv(launched) != nullptr) return true;
  }
  if (berth::slurm_step_tasks() > 1) return true;
  const std::string word = command_word(argc, argv);
  return word == "train" || word == "plan";
}

// Only `train` and `plan --calibrate` work with every rank, and `devices` is each host's own
// (`srun -N 4 berth devices register` registers every node's GPUs; a host's ranks register the
// same devices again, which changes nothing). Any other command launched on several ranks runs
// once, on rank 0: `srun berth reserve ...` in a batch script of 8 tasks booked 8 times, and
// `mpirun -np 2 berth plan --json` printed two JSON documents interleaved.
bool runs_on_every_rank(int argc, char** argv) {
  const std::string word = command_word(argc, argv);
  return word == "train" || word == "devices" ||
         (word == "plan" && has_argument(argc, argv, "--calibrate"));
}

// The other ranks of a command that runs once wait for rank 0's exit status and exit with it (a
// non-blocking broadcast, polled: a blocking one would keep their cores busy for as long as rank 0
// works, e.g. a long `data import`).
int rank0_status(int code) {
  MPI_Request request;
  MPI_Ibcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return code;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Parses the command line and runs the command: its exit status. `every_rank_agreed`: the status
// is an outcome every rank reached together (no MPI_Abort needed).
int run_command(int argc, char** argv, int rank, int world, bool* every_rank_agreed) {
  CLI::App app{"berth: distributed training runtime for GPT-style language models", "berth"};
  app.set_version_flag("--version", berth::version_text());
  app.require_subcommand(1);
  berth::register_train_command(app);
  berth::register_data_commands(app);
  berth::register_model_commands(app);
  berth::register_pack_command(app);
  berth::register_eta_commands(app);
  berth::register_plan_command(app);
  berth::register_ledger_commands(app);

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // A mistyped command (`berth trian`) or option before any command left CLI11 with no
      // subcommand: it said only "A subcommand is required". The word is named, with the commands.
      const std::vector<std::string> extra = app.remaining();
      if (dynamic_cast<const CLI::RequiredError*>(&e) && app.get_subcommands().empty() &&
          !extra.empty()) {
        std::string names;
        for (const CLI::App* sub : app.get_subcommands({}))
          names += (names.empty() ? "" : ", ") + sub->get_name();
        const std::string what = extra.front().rfind('-', 0) == 0 ? "option" : "command";
        const CLI::ExtrasError unknown(
            "unknown " + what + " '" + extra.front() + "'; the commands are " + names,
            CLI::ExitCodes::ExtrasError);
        return (rank == 0) ? app.exit(unknown) : unknown.get_exit_code();
      }
      return (rank == 0) ? app.exit(e) : (e.get_exit_code() != 0 ? e.get_exit_code() : 0);
    }
  } catch (const berth::ExitStatus& e) {
    *every_rank_agreed = true;  // an outcome every rank reached together: no MPI_Abort
    return e.code;
  } catch (const berth::Error& e) {
    wait_for_rank0_report(rank, world);
    const char* debug = std::getenv("BERTH_DEBUG");
    const bool where = debug && *debug && std::string(debug) != "0" && !e.where().empty();
    berth::log_error("{}{}", e.what(), where ? " [" + e.where() + "]" : "");
    return berth::kExitError;
  } catch (const std::bad_alloc&) {
    wait_for_rank0_report(rank, world);
    berth::log_error(
        "out of memory: this command asked for more memory than the process can have. A model "
        "or dataset file may declare sizes larger than it holds (check it with `berth data info` "
        "or `h5dump -H`), or the config is too large for this machine (see `berth plan`)");
    return berth::kExitError;
  } catch (const std::exception& e) {
    wait_for_rank0_report(rank, world);
    berth::log_error("internal error: {}", e.what());
    return berth::kExitError;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  berth::skip_hdf5_cleanup_at_exit();
  // The communicator watchdog (runtime/comm/watchdog.h) and the lease keeper run threads of their
  // own, but only the main thread calls MPI.
  const bool mpi = needs_mpi(argc, argv);
  int rank = 0, world = 1;
  if (mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }
  berth::set_identity(rank, world);
  // Ctrl-C or a job's time limit removes the temporaries of a command's outputs; train stops
  // cleanly with a checkpoint on its own handlers instead.
  if (command_word(argc, argv) != "train") berth::remove_temporaries_on_signals();

  int code = 0;
  bool every_rank_agreed = false;
  if (world > 1 && !runs_on_every_rank(argc, argv)) {
    if (rank == 0) {
      const std::string word = command_word(argc, argv);
      if (!word.empty()) {
        // On standard error: the command's output (--json) stays what it is on one rank.
        berth::log_warn(
            "berth {} runs once, on rank 0 of the {} ranks launched; the others wait "
            "and exit with its status",
            word, world);
      }
      code = run_command(argc, argv, rank, world, &every_rank_agreed);
    }
    code = rank0_status(code);
  } else {
    code = run_command(argc, argv, rank, world, &every_rank_agreed);
    if (code != 0 && world > 1 && !every_rank_agreed) {
      MPI_Abort(MPI_COMM_WORLD, code);  // no peer hangs in a collective
    }
  }
  if (mpi) MPI_Finalize();
  return code;
}
