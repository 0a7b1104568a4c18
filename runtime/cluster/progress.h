// Offline/online progress prediction (ETA) for a training session: pure, clock-free.
//
// The runtime (or `berth eta replay`) feeds one StepRecord per finished optimizer step, in order,
// and asks for a Prediction of the session's total wall time. Nothing here reads a clock; all times
// are seconds measured by the caller. The model (docs/progress.md):
//   total = elapsed (observed, exact)
//         + remaining steps × (robust recent per-cost rate) × (scheduled cost of each future step)
//         + remaining checkpoint / eval steps × their learned extra cost (prior before the first)
//         + remaining steps × unplanned-overhead rate (spikes, epoch boundaries, recurring data
//           waits), shrunk toward 0; once a whole data epoch was seen, its profile of costs above
//           the rate, repeated over the remaining steps, instead
// where a step's cost is tokens × (1 + seq_len / (6·hidden_size)) (attention share of the FLOPs).
// Warm-up rows (first step of the session, compile, resume, warmup), the configured warm-up steps
// and the slow transient after them are excluded from the rate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/limits.h"

namespace berth {

// One config-announced change: from global step `from_step` on (steps s with s-1 >= from_step,
// steps counted from 1), sequences are `seq_len` long and a step processes `tokens_per_step`.
struct ScheduleEntry {
  int64_t from_step = 0;
  int64_t seq_len = 0;
  int64_t tokens_per_step = 0;
};

// What the runtime knows about the session from its configuration.
// The most global steps a run may have, and the longest time a trace row may give a step (or a
// part of one): the build's limits (runtime/core/limits.h), which the config checks too.
constexpr int64_t kMaxPredictedSteps = limits::kMaxSteps;
constexpr double kMaxStepSeconds = limits::kMaxSeconds;

struct RunFacts {
  int64_t max_steps = 0;   // run's total optimizer steps (global)
  int64_t start_step = 0;  // global step at which this session began (> 0: resumed)
  int64_t session_steps =
      0;  // steps this session runs: global steps start_step+1 .. start_step+session_steps
  int64_t ckpt_interval = 0;            // 0 = no periodic checkpoints
  int64_t eval_interval = 0;            // 0 = no periodic evaluation
  std::vector<ScheduleEntry> schedule;  // sorted by from_step; at least one entry
  int64_t hidden_size = 0;
  double mem_capacity_gib = 0.0;
  double lease_s = 0.0;  // seconds the session's lease lasts (0 = unknown)
  // The session's first `warmup_steps` steps are sampled but not trusted for the rate (they are
  // used only while nothing later exists). 0 = detect the warm-up transient alone.
  int64_t warmup_steps = 0;
  // Whether the session's last step checkpoints / evaluates whatever the interval: -1 = unknown
  // (the interval decides, as for any other step), 0 = no, 1 = yes (berth's checkpoint.final, and
  // its evaluation at the end of training).
  int final_ckpt = -1;
  int final_eval = -1;
  // The runtime's priors for an event's cost before the first is seen (0 = the predictor's own:
  // 100 step times for a checkpoint, 50 for an evaluation): a checkpoint's seconds (berth: its
  // bytes at an assumed write rate) and an evaluation's length in step times (berth: its batches'
  // forward passes against a training step's forward and backward).
  double ckpt_prior_s = 0;
  double eval_prior_steps = 0;
};

// One row of a trace: a finished optimizer step of this session.
struct StepRecord {
  int64_t step = 0;         // global step, counted from 1
  double duration_s = 0.0;  // wall time, everything included
  int64_t tokens = 0;
  int64_t seq_len = 0;
  double compute_s = 0.0, comm_s = 0.0, data_wait_s = 0.0, overhead_s = 0.0;
  double mem_gib = 0.0;
  std::string event;  // "", "first_step", "compile", "ckpt", "eval", "ckpt+eval", "spike", ...
};

// Checkpoints (or evaluations) among global steps (after, last] with last the run's last step:
// the multiples of `interval` (0 = none), the last step's as `at_last` says (RunFacts::final_ckpt
// / final_eval: -1 = the interval decides, 0 = no, 1 = yes).
int64_t events_between(int64_t after, int64_t last, int64_t interval, int at_last);

// Whether every '+'-separated part of a step's event is a checkpoint save or an evaluation
// ("ckpt", "eval", "ckpt+eval"): such a step less its overhead_s is a normal step.
bool only_ckpt_or_eval(const std::string& event);

struct Prediction {
  double total_s = 0.0;      // predicted wall time of the whole session
  double remaining_s = 0.0;  // total_s - elapsed
  double low_s = 0.0;        // band on total_s
  double high_s = 0.0;
  bool lease_exceeded = false;  // total_s > lease_s (false when lease_s is 0)
  double step_s = 0.0;          // steady time of one normal step at the current schedule entry
  double checkpoint_s = 0.0;    // checkpoint time of the whole session: observed + predicted
  double eval_s = 0.0;          // evaluation time of the whole session: observed + predicted
  int checkpoints_observed = 0;  // checkpoint steps seen so far (before: checkpoint_s is a prior)
  double ckpt_cost_s = 0.0;  // one checkpoint's extra time over a normal step (learned or prior)
  double eval_cost_s = 0.0;  // one evaluation's, likewise
};

class ProgressPredictor {
 public:
  explicit ProgressPredictor(RunFacts facts);  // throws berth::Error on inconsistent facts
  // Steps must arrive in increasing order and lie inside the session; throws otherwise.
  void observe(const StepRecord& record);
  // The newest observed step again, amended (a save that followed it: a stop's checkpoint).
  void amend_last(const StepRecord& record);
  // Before any observation: a prediction from priors only is not possible, throws berth::Error.
  Prediction predict() const;
  int64_t steps_observed() const { return static_cast<int64_t>(records_.size()); }
  double elapsed_s() const { return elapsed_s_; }
  const RunFacts& facts() const { return facts_; }
  // The lease now lasts `lease_s` seconds from the session's start (it was extended or cut
  // short): lease_exceeded compares with it from the next prediction on. Throws when < 0.
  void set_lease_s(double lease_s);

 private:
  RunFacts facts_;
  std::vector<StepRecord> records_;
  double elapsed_s_ = 0.0;
};

// Cost weight of one step in "token units": tokens × (1 + seq_len / (6·hidden_size)).
double step_cost(int64_t tokens, int64_t seq_len, int64_t hidden_size);
// Schedule entry in force at global step `step` (counted from 1).
const ScheduleEntry& schedule_at(const RunFacts& facts, int64_t step);

// ---- baselines -------------------------------------------------------------------------------
// elapsed / steps_done × session_steps.
double linear_total_s(const std::vector<StepRecord>& rows, int64_t session_steps);
// tqdm-style: EMA of step time (new = a·x + (1-a)·old, a = smoothing), elapsed + EMA × remaining.
double moving_average_total_s(const std::vector<StepRecord>& rows, int64_t session_steps,
                              double smoothing = 0.3);

// ---- files -----------------------------------------------------------------------------------
// Trace CSV with header
// step,duration_s,tokens,seq_len,compute_s,comm_s,data_wait_s,overhead_s,mem_gib,event
std::vector<StepRecord> read_trace_csv(const std::string& path);
// Trace rows as read_trace_csv returns them (one per step, in order). Throws a specific Error
// unless they begin at the session's first step and end within it (global steps start_step + 1 ..
// start_step + session_steps), naming `trace` and `facts_where`.
void check_trace_in_session(const std::vector<StepRecord>& rows, const RunFacts& facts,
                            const std::string& trace, const std::string& facts_where);
std::string trace_csv_header();                  // the header line, with '\n'
std::string trace_csv_row(const StepRecord& r);  // one row, with '\n' (read back by read_trace_csv)
// One run-facts object, given as JSON text (starts with '{') or a path to a file holding one.
// Ignores `file`, `seed`, `scenario` and `true_total_s`; `warmup_steps` is optional (default 0).
RunFacts read_run_facts_json(const std::string& path_or_json);
// The facts as one JSON object in the index.json format (read back by read_run_facts_json).
std::string run_facts_to_json(const RunFacts& facts);

// ---- bench (the protocol of shared/eta/README.md) ----------------------------------------------
struct EtaBenchRow {
  double p = 0.0;  // progress fraction
  int n = 0;       // queries (traces × query steps)
  double berth_mape = 0, berth_p90 = 0, berth_worst = 0;
  double linear_mape = 0, linear_p90 = 0, linear_worst = 0;
  double ma_mape = 0, ma_p90 = 0, ma_worst = 0;
  // NaN where no query had time remaining (steps of no time at the end)
  double berth_rem_mape = 0, linear_rem_mape = 0, ma_rem_mape = 0;
  // Over the `leased` queries of runs with a lease (lease_s > 0); NaN when there are none.
  double berth_lease_agree = 0, linear_lease_agree = 0, ma_lease_agree = 0;  // fractions
  int leased = 0;
};
// Runs every trace of DIR/index.json; at each p of {5,10,25,50,75} % queries 5 steps within ±0.5 %.
std::vector<EtaBenchRow> run_eta_bench(const std::string& dir);

}  // namespace berth
