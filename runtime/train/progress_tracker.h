// Progress of a training session, as the trainer sees it: every rank times its step (compute,
// exposed communication, data wait, overhead) and its memory; the fixed-size records are
// gathered to rank 0 each step, which feeds the ProgressMonitor, appends the step to trace.csv
// (the format `berth eta replay` reads, with run_facts.json beside it), adds the fields to the
// step's metrics.jsonl object, and every progress.interval steps logs a [progress] block with
// the ETA and the warnings that are due. docs/progress.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/grid.h"
#include "runtime/cluster/progress_monitor.h"
#include "runtime/config/config.h"
#include "runtime/core/backend.h"
#include "runtime/core/fs.h"

namespace berth {

struct StepStats;

class ProgressTracker {
 public:
  // Collective over grid.world(). Rank 0 writes <run_dir>/run_facts.json and starts
  // <run_dir>/trace.csv.partial (a resumed session first moves the previous session's trace to
  // trace.before-<start_step>.csv). `tokens_per_step`: tokens of one global batch.
  // `window_end_unix` / `reservation`: the lease's window (0 = progress.window_end, if set).
  // `backend`: the model's; when it reports a device's memory (a GPU), memory is its allocator's
  // in use and peak, the device's free memory, and the capacity the device's total; otherwise
  // the host's RSS and memory.
  ProgressTracker(const RunConfig& cfg, ProcessGrid& grid, const std::string& run_dir,
                  int64_t start_step, int64_t tokens_per_step, double flops_per_token,
                  double window_end_unix = 0, int64_t reservation = 0,
                  const Backend* backend = nullptr);

  // Runs f() and books its whole wall time as overhead of the current step (evaluation,
  // checkpoint save); the communication inside it is left out of the step's comm_s. (Booked less
  // its communication, a save's barrier wait on the ranks that do not write stayed in comm_s: a
  // run saving every step looked communication-bound, and its saves small.)
  template <typename F>
  void overhead(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = grid_.comm_seconds();
    f();
    overhead_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    overhead_comm_s_ += grid_.comm_seconds() - c0;
  }

  // Ends global step `done` (counted from 1); `new_epoch`: the data loader began a new pass over
  // the data in this step. Collective (the gather). On rank 0: observes it,
  // appends the trace row and adds the step's measurements to `line`; at every progress.interval
  // steps of the session and at its last step also the prediction, and logs the block.
  void end_step(int64_t done, const StepStats& st, bool evaluated, bool checkpointed,
                bool new_epoch, nlohmann::json* line);

  // Rank 0 (a no-op elsewhere): the lease's window now ends at `window_end_unix` (extended or
  // cut short). When it moved, the window warning and the lease flag follow it from the next
  // block, and run_facts.json is rewritten with the new lease_s, so a replay agrees.
  void set_window_end(double window_end_unix, bool preempted = false, double stop_reserve_s = 0);

  // The session ends after step `done`, which end_step recorded, because a stop signal or the
  // window's end stopped it. `save_s` > 0: a checkpoint was saved after that step (the stop's):
  // its time is booked into the step's trace row and `line` (event "ckpt"), so the steps still
  // tile the session. Logs the step's block, as at a last step, unless it was logged. Rank 0;
  // a no-op elsewhere, and no collective.
  void stopped_after(int64_t done, double save_s, nlohmann::json* line);

  // Rank 0: trace.csv.partial becomes trace.csv; logs the cost of gathering the records.
  void finish();
  // Rank 0, instead of finish() when the lease was lost: closes the trace and commits nothing,
  // since the run directory may now be the lease's new holder's.
  void abandon();

 private:
  // Rank 0: the prediction into `line` and the [progress] block with its due warnings.
  void log_block(int64_t done, nlohmann::json* line);

  const RunConfig& cfg_;
  ProcessGrid& grid_;
  const Backend* backend_;  // null: host memory
  std::string run_dir_;
  int64_t start_step_, tokens_per_step_;
  std::unique_ptr<ProgressMonitor> monitor_;  // rank 0
  std::ofstream trace_;                       // rank 0
  std::streamoff last_row_at_ = 0;            // rank 0: where the newest trace row starts
  bool trace_failed_ = false;  // rank 0: a write of trace.csv.partial failed (not committed)
  FileId trace_id_;            // rank 0: the file trace_ writes (a stop's amend cuts only that one)
  int64_t last_block_step_ = -1;              // rank 0: the step of the newest block logged
  double session_start_unix_ = 0;
  double window_end_unix_ = 0;  // rank 0: the window the monitor uses (0 = none)
  double stop_reserve_s_ = 0;   // rank 0: and how long before its end a leased run stops
  bool tty_ = false;
  std::chrono::steady_clock::time_point mark_;  // start of the current step
  double comm_mark_ = 0;                        // grid.comm_seconds() at mark_
  double overhead_s_ = 0;
  double overhead_comm_s_ = 0;  // communication inside overhead_s_ (not in the step's comm_s)
  double last_gather_s_ = 0;           // this rank's time in the previous gather
  double gather_s_ = 0, walls_s_ = 0;  // totals over the session (rank 0)
  int64_t steps_ = 0;
};

}  // namespace berth
