// Typed run configuration. This is the only module that includes toml++.
//
// A config file is TOML with the sections below; every key is optional and has the default shown
// in the struct. Unknown sections or keys, and values of the wrong type, are errors that name the
// key and the file ("configs/x.toml: unknown key 'train.lrr' (known keys of [train]: ...)").
// `--set section.key=value` overrides are applied after the file, with the same checks; the value
// is parsed as a TOML value (`--set train.lr=3e-4`, `--set run.name=foo`, `--set
// data.shuffle=true`; a value that is not valid TOML is taken as a string, except a number TOML
// cannot hold, e.g. one beyond 64 bits, which is refused). A validation error about a key an
// override set names it.
#pragma once

#include <cstdint>
#include <string>
#include <typeinfo>
#include <vector>

#include "runtime/core/check.h"

namespace berth {

struct RunSection {
  std::string name = "run";
  std::string out_dir = "runs";
  int64_t seed = 1337;
  // Where the model runs: "cpu", "cuda" (a GPU per rank: local rank % GPUs of the host) or "auto"
  // (CUDA when this berth has it and a GPU is visible, else the CPU).
  std::string device = "cpu";
  // The GEMMs' precision: "fp32", or "bf16" (bf16 inputs, fp32 accumulation and outputs; fp32
  // master weights, moments, gradients and loss). On the CPU bf16 is emulated (kernels/ops.h
  // round_to_bf16): it has the numerics of a GPU run, not its speed.
  std::string precision = "fp32";
};

struct ModelSection {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 256;
  int64_t vocab_size = 257;
  int64_t max_seq_len = 256;
  std::string init_from;  // checkpoint directory whose weights start the run ("" = random init)
};

struct DataSection {
  std::string train;          // HDF5 token dataset (required to train)
  std::string val;            // optional; "" = no validation
  std::string mode = "stream";
  int64_t seq_len = 256;
  bool shuffle = false;
  std::string pack_algorithm = "bfd";  // mode "packed": "bfd" | "next_fit" | "balanced"
  int64_t pack_window = 1000;          // BFD window, in document pieces
  int64_t pack_align = 0;              // pieces padded to a multiple of this; 0 = 2·cp (1 without CP)
  std::string long_docs = "split";     // documents longer than seq_len: "split" | "drop"
  std::string pack_plan;  // plan file for data.train ("" = <train>.plan-<algorithm>-T<seq_len>.h5)
};

struct TrainSection {
  int64_t micro_batch_size = 4;
  int64_t steps = 100;
  double lr = 3e-4;
  std::string lr_schedule = "cosine";  // "constant" | "cosine"
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = off
  int64_t log_interval = 1;
};

struct EvalSection {
  int64_t interval = 0;  // 0 = never
  int64_t batches = 4;
};

struct ParallelSection {
  int64_t tp = 1;            // tensor-parallel ranks
  int64_t pp = 1;            // pipeline stages
  int64_t cp = 1;            // context-parallel ranks
  int64_t dp = 0;            // data-parallel replicas; 0 = world size / (tp·pp·cp)
  int64_t zero = 0;          // 0: replicated optimizer state; 1: AdamW moments sharded over dp×cp
  int64_t microbatches = 1;  // micro-batches per step and rank (gradient accumulation)
  std::string schedule = "1f1b";  // pipeline schedule when pp > 1: "1f1b" | "afab"
  // A communicator call still waiting after this many seconds ends the job (exit 5) with the
  // call's name: a peer hangs or died. 0 = never. Must exceed the longest wait one rank can
  // cause the others (a checkpoint save, an evaluation, a slow step).
  double comm_timeout_s = 600;
};

struct CheckpointSection {
  std::string dir;        // "" = <out_dir>/<name>/checkpoints
  int64_t interval = 0;   // save every N steps (0 = only the final checkpoint)
  int64_t keep_last = 0;  // keep the newest N complete checkpoints (0 = all)
  bool final = true;      // save a checkpoint at the end of training
};

struct ProgressSection {
  int64_t interval = 50;       // log a [progress] block (ETA, throughput, warnings) every N steps
  int64_t warmup_steps = 50;   // first steps of a session: sampled, not trusted for the rate
  double peak_tflops = 0;      // dense peak per rank for MFU (0 = unknown: GFLOP/s is shown)
  double mem_capacity_gib = 0; // memory per rank (0 = host memory / ranks on the host)
  std::string window_end;      // end of the booked window, UTC ("2026-12-03T20:00:00Z"; "" = none)
};

struct ReservationSection {
  int64_t id = 0;                     // reservation to train under (0 = none; see `without`)
  std::string ledger;                 // "" = $BERTH_LEDGER, else ~/.local/share/berth/ledger.db
  double lease_ttl_s = 60;            // the lease lapses this long after the last renewal
  double stop_margin_s = 30;          // stop this long + 1.5 × checkpoint time before the end
  double checkpoint_estimate_s = 60;  // checkpoint time assumed until one is measured
  std::string without = "none";  // no id: "none" (no lease), "refuse", "on-demand" (P3 now)
  double on_demand_s = 3600;     // length of an on-demand booking
};

struct DebugSection {
  int64_t fail_rank = -1;  // fault injection: this rank throws at step fail_step (-1 = off)
  int64_t fail_step = -1;
  double checkpoint_pause_s = 0;  // sleep inside every checkpoint save, before its commit
  double data_delay_s = 0;        // sleep in every micro-batch load, on every rank (data-bound)
  int64_t slow_rank = -1;         // this rank sleeps slow_rank_s per step (a straggler)
  double slow_rank_s = 0;
  double leak_mib_per_step = 0;   // every rank allocates and keeps this much per step (a leak)
  int64_t stall_step = -1;        // rank 0 stops stall_s before step stall_step starts (-1 = off)
  double stall_s = 0;
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  EvalSection eval;
  ParallelSection parallel;
  CheckpointSection checkpoint;
  ProgressSection progress;
  ReservationSection reservation;
  DebugSection debug;
  std::string source;  // path the config was read from ("" when built in code)
};

// Reads `path`, applies `overrides` ("section.key=value"), validates. Throws berth::Error with a
// specific message (missing file, TOML syntax error with line/column, unknown key, wrong type,
// bad value such as steps <= 0 or lr_schedule = "linear").
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// `message` with " (set by the override 'data.seq_len=126')" for each of `overrides` whose key it
// names before its advice (the first "; "), unless it names one already. Checks after load_config
// (the layout, the data, the trainer's, the plan's) name the config file, where a value that an
// override set is not.
std::string with_overrides_named(const std::string& message,
                                 const std::vector<std::string>& overrides);

// Runs f(); a berth::Error it throws (that class itself: a subclass carries an outcome, e.g.
// LeaseRefused) is thrown again with_overrides_named.
template <typename F>
decltype(auto) naming_overrides(const std::vector<std::string>& overrides, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (typeid(e) != typeid(Error)) throw;
    throw Error(with_overrides_named(e.what(), overrides), e.where());
  }
}

// Same as load_config but from TOML text; `source_name` is used in error messages.
RunConfig parse_config(const std::string& toml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides = {});

// Checks every value range (sizes > 0, d_model % n_head == 0, seq_len <= max_seq_len,
// lr_schedule/mode known, betas in [0,1), ...). Called by load/parse; callable after edits.
void validate_config(const RunConfig& cfg);

// The fully resolved config as TOML text (every key, defaults included), parseable by
// parse_config to the same values.
std::string config_to_toml(const RunConfig& cfg);

// What a leased run keeps before its window ends to stop cleanly: 1.5 × a checkpoint save
// (`checkpoint_s`; reservation.checkpoint_estimate_s before one was measured) + stop_margin_s.
double stop_reserve_s(const ReservationSection& r, double checkpoint_s);
inline double stop_reserve_s(const ReservationSection& r) {
  return stop_reserve_s(r, r.checkpoint_estimate_s);
}

// The fields whose values differ, in config order, each as "section.key = A vs B" (values written
// as in config_to_toml): what a user must make the same.
std::vector<std::string> config_differences(const RunConfig& a, const RunConfig& b);

}  // namespace berth
