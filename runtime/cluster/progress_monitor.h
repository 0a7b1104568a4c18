// Live progress of a training session on rank 0: every rank's step measurements in, an ETA, a
// throughput summary and warnings out. Pure and clock-free like ProgressPredictor: the trainer
// measures, gathers and passes times; tests feed synthetic records.
//
// Warnings (docs/progress.md, "Warnings"), each over the recent window of normal steps:
//   data-bound      ranks wait for batches >= 10 % of step time
//   comm-bound      exposed communication >= 30 % of step time (not raised when a rank slower
//                   than the others in the newest window explains the waiting)
//   straggler       one rank busy (wall − communication) >= 10 % longer than the median of the
//                   others of its pipeline stage, and their slowest in >= 60 % of the steps, in
//                   both halves of the newest normal steps (up to twice the window)
//   memory          a rank's memory grows and, at that rate, passes the capacity before the end
//   window          the booked window ends before the predicted finish (with the fix)
//   checkpoints     checkpoints take >= 10 % of the session (once one was measured)
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cluster/progress.h"

namespace berth {

// One rank's measurements of one step. All doubles so that it is gathered as one fixed-size
// block (kRankStepMetricsDoubles) to rank 0.
struct RankStepMetrics {
  double wall_s = 0;        // the whole step on this rank, evaluation and checkpoint included
  double compute_s = 0;     // wall − comm − data_wait − overhead
  double comm_s = 0;        // exposed communication: blocked in collectives / point-to-point
  double data_wait_s = 0;   // waiting for the step's batches
  double bubble_s = 0;      // pipeline bubble (pp > 1): the part of comm_s blocked in stage transfers
  double overhead_s = 0;    // checkpoint save and evaluation
  double tokens = 0;        // tokens this rank processed (its share with tp, pp: Σ ranks = global)
  double mem_gib = 0;       // memory in use at the end of the step (host: RSS; GPU: allocator)
  double mem_peak_gib = 0;  // high-water mark so far (host: peak RSS; GPU: allocator peak)
  double device_free_gib = 0;  // a GPU's free memory at the end of the step (0: not a GPU)
  double gather_s = 0;      // this rank's time in the previous step's gather of these records
};
constexpr size_t kRankStepMetricsDoubles = sizeof(RankStepMetrics) / sizeof(double);
static_assert(sizeof(RankStepMetrics) == kRankStepMetricsDoubles * sizeof(double));

struct MonitorSettings {
  std::vector<std::string> rank_names;  // "rank@host", one per rank (size = number of ranks)
  // Each rank's pipeline stage (empty: one stage). A straggler is a rank slower than the others
  // of its stage: stages differ in work (the last has the LM head and the loss).
  std::vector<int> rank_stage;
  double flops_per_token = 0;           // model FLOPs per token (forward + backward)
  double peak_flops_per_rank = 0;       // 0 = unknown (no MFU)
  double session_start_unix = 0;        // wall-clock start of the session (for the ETA)
  double window_end_unix = 0;           // end of the booked window (0 = none)
  // A leased run stops this long before window_end_unix, to save its checkpoint in time (1.5 ×
  // checkpoint time + reservation.stop_margin_s): its steps must end by then.
  double stop_reserve_s = 0;
  std::string reservation;              // reservation id for the `berth extend` hint ("" = unknown)
  bool preempted = false;  // a preemption cut the window: `berth extend` cannot lengthen it
};

enum class WarningKind { DataBound, CommBound, Straggler, Memory, Window, Checkpoints };
const char* warning_name(WarningKind kind);  // "data-bound", "comm-bound", ...

struct ProgressWarning {
  WarningKind kind;
  std::string message;  // what, by how much, and what to do
};

struct ProgressReport {
  int64_t step = 0;      // global steps done
  int64_t end_step = 0;  // global step at which the session ends
  int64_t first_step = 0;  // global step the session started after
  Prediction prediction;
  double elapsed_s = 0;
  double tokens_per_s = 0;        // recent window, all ranks
  double tokens_per_s_rank = 0;   // per rank
  double model_flops_per_s = 0;   // recent window, all ranks
  double mfu = -1;                // -1 = unknown peak
  double peak_mem_gib = 0;        // highest peak over ranks so far
  double mem_capacity_gib = 0;
  std::vector<ProgressWarning> warnings;
};

class ProgressMonitor {
 public:
  ProgressMonitor(RunFacts facts, MonitorSettings settings);

  // One finished step: `step` is the global step (counted from 1), `ranks[r]` rank r's record,
  // `global_tokens` the tokens of the step over the whole batch, `event` "" or what happened
  // ("first_step", "resume", "eval", "ckpt", "ckpt+eval"). Returns the trace row it recorded.
  const StepRecord& observe(int64_t step, const std::vector<RankStepMetrics>& ranks,
                            int64_t global_tokens, int64_t seq_len, const std::string& event);

  // The newest step took `extra_s` more, spent in `event` ("ckpt": the checkpoint a stop saved
  // after it, on a signal or at the window's end). Returns its amended trace row.
  const StepRecord& amend_last(double extra_s, const std::string& event);

  ProgressReport report() const;  // needs one observed step

  // The warnings of `r` worth logging now: new kinds, and every `repeat_blocks`-th report of a
  // kind that stays active. Call once per logged report.
  std::vector<ProgressWarning> due(const ProgressReport& r, int repeat_blocks = 10);

  // The booked window now ends at `window_end_unix` (the lease was extended or cut short): the
  // window warning, its `berth extend` hint and the lease flag follow it from the next report.
  // `preempted`: a preemption cut it, so the warning advises resuming elsewhere, not extending.
  // `stop_reserve_s`: the run stops that long before the window's end (MonitorSettings).
  void set_window_end(double window_end_unix, bool preempted = false, double stop_reserve_s = 0);

  const ProgressPredictor& predictor() const { return predictor_; }

 private:
  struct Sample {
    int64_t step;
    bool normal;  // no event
    bool netted;  // only checkpoint saves or evaluations: `ranks` hold the step without them
    std::vector<RankStepMetrics> ranks;
  };
  // Over some normal steps: each rank's summed busy time (wall − communication), how often it was
  // the slowest of its stage, and the rank with the highest median ratio to the others of its
  // stage with whether it passes the straggler test.
  struct StragglerStats {
    std::vector<double> busy;
    std::vector<int> slowest;
    size_t worst = 0;
    bool is_straggler = false;
  };
  StragglerStats straggler_stats(const std::vector<const Sample*>& steps) const;
  std::optional<ProgressWarning> straggler_warning() const;
  std::vector<ProgressWarning> warnings(const ProgressReport& r) const;
  // The newest n steps after the warm-up that are free of events, or, fewer than `least` of those,
  // the netted ones too (a warning that needs `least` steps then looks at both).
  std::vector<const Sample*> recent_normal(size_t n, size_t least) const;
  int stage_of(size_t rank) const;

  RunFacts facts_;
  MonitorSettings settings_;
  ProgressPredictor predictor_;
  std::deque<Sample> history_;  // the newest kHistory steps
  StepRecord last_;
  double peak_mem_gib_ = 0;
  std::vector<int> active_blocks_;  // per WarningKind: consecutive reports it has been active
  std::vector<std::vector<size_t>> stage_members_;  // the ranks of each pipeline stage
};

// The one-line block: "[progress] step 1200/12000 (10.0%) | elapsed 1h02m | remaining 9h18m ±12m
// (ETA 2026-12-03 20:31 UTC) | 124k tok/s (15.5k/rank) | MFU 41% | peak mem 18.7/24.0 GiB |
// checkpoints ~8m", with a bar in front when `bar` (a terminal).
std::string format_progress(const ProgressReport& r, double session_start_unix, bool bar);

// "124k", "1.2M", "950".
std::string format_count(double x);

}  // namespace berth
