// CLI11 registration of berth's subcommands; each cmd_*.cpp adds its own. The callbacks run inside
// app.parse(), so errors they throw reach main's handler.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
class Validator;
}

namespace berth {

std::string version_text();  // "berth 0.1.0 (CUDA: ...)"

// An option that must be a whole number ≥ 1 ("--gpus: 0 is not a whole number >= 1"), instead of
// CLI::PositiveNumber's "Value 0 not in range 0.000000 to 1.797…e+308".
CLI::Validator positive_integer();
// A whole number of 64 bits that is >= lo (INT64_MIN: any), refusing what overflows: CLI11 itself
// saturates 2^64 to the largest value.
CLI::Validator whole_number_at_least(int64_t lo);
// A whole number in [lo, hi] ("--gpus: 4294967297 is not a whole number in [1, 65536]").
CLI::Validator whole_number_in(int64_t lo, int64_t hi);
// A value that must not be empty ("--ledger: empty: <if_empty>"): an option given an unset
// variable ("--ledger \"$UNSET\"") would otherwise mean its default.
CLI::Validator non_empty(const std::string& if_empty, const std::string& type_name);
// A number in [lo, hi], or (lo, hi] with `above_lo` ("--hours: nan is not a number in [1, 8784]").
// CLI::Range lets NaN through (every comparison with it is false), and "inf" past an open bound.
CLI::Validator number_in(double lo, double hi, bool above_lo = false);

// The number of tasks of this srun step (SLURM_STEP_NUM_TASKS, which srun sets for its tasks and
// a batch script's own shell lacks); 0 outside srun or when the value is not a number.
long slurm_step_tasks();

void register_train_command(CLI::App& app);  // berth train CONFIG [--set k=v]...
void register_data_commands(CLI::App& app);  // berth data import|info
void register_model_commands(CLI::App& app);  // berth model import|export
void register_pack_command(CLI::App& app);  // berth pack --data D.h5 --seq-len T --out PLAN.h5
void register_eta_commands(CLI::App& app);  // berth eta replay|bench (progress prediction)
void register_plan_command(CLI::App& app);  // berth plan CONFIG | --calibrate
// berth devices [register] | reserve | reservations | reservation show | cancel | extend | timeline
void register_ledger_commands(CLI::App& app);

// Exit statuses that are outcomes, not errors (docs/cli.md). A command throws ExitStatus after
// printing what happened; every rank of a job throws it together, so main does not MPI_Abort.
constexpr int kExitError = 1;  // an error, printed (also thrown as ExitStatus when every rank
                               // reached it together, e.g. a bad config)
constexpr int kExitNotNow = 2;        // reserve: cannot book when asked (earliest start printed)
constexpr int kExitWindowEnded = 3;   // train: the booked window ends; checkpointed, resumable
constexpr int kExitLeaseLost = 4;     // train: no lease (refused, taken over, or cancelled)
// Not an outcome but a failure with its own status: a communicator call outlived
// parallel.comm_timeout_s; the process exits at once (runtime/comm/watchdog.h).
constexpr int kExitCommTimeout = 5;
constexpr int kExitSignalled = 6;  // train: stopped on SIGTERM/SIGINT/SIGUSR1; checkpointed
struct ExitStatus {
  int code;
};

}  // namespace berth
