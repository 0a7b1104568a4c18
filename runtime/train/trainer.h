// Trainer: the wiring of one training run — process grid, data, model, optimizer, schedule,
// evaluation, logging and the run directory (out_dir/name/ with config.toml and metrics.jsonl,
// written by rank 0).
//
// Every rank holds its part of the model (a tp slice of a pipeline stage; docs/parallelism.md).
// Data parallelism: DP rank d reads its rows of each global batch (StreamLoader shards), gradients are summed over dp×cp (bucketed all-reduce, or
// reduce-scatter with ZeRO-1), and the loss is normalized per target token over the global batch
// (sum and count reduced), so dp ranks with micro_batch_size B train exactly like one rank with
// B·dp rows, up to floating-point summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "packing/packed_batch.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "runtime/cluster/plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/config/config.h"
#include "runtime/io/token_dataset.h"
#include "runtime/model/gpt.h"
#include "runtime/train/data_loader.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/run_dir_lock.h"

namespace berth {

struct CheckpointMeta;

struct StepStats {
  int64_t step = 0;          // 0-based
  double loss = 0;           // mean cross-entropy per target token of this step's batch
  double lr = 0;
  double grad_norm = 0;      // before clipping
  double seconds = 0;        // wall time of the step on rank 0 (data + fwd + bwd + sync + update)
  double tokens_per_s = 0;   // global: `tokens` per second
  double model_flops_per_s = 0;  // global
  double val_loss = -1;      // when evaluated after this step's update, else -1
  double data_wait_s = 0;    // this rank's time loading the step's batches
  double bubble_s = 0;       // this rank's time blocked in pipeline transfers (pp > 1)
  // Tokens of documents the step's global batch trained on (padding excluded; 0 when skipped).
  int64_t tokens = 0;
  bool no_targets = false;   // every target of the global batch was masked: no update, loss NaN
};

class Trainer {
 public:
  // Validates the config and the parallel layout against `world`, reads the datasets and checks
  // them against the model, allocates everything. Throws Error with an actionable message on any
  // bad input. Collective over `world` (every rank constructs its Trainer together).
  // `backend` (tests): run on this backend, on host memory, instead of making run.device's; the
  // caller keeps it alive.
  // `resume` (berth train --resume): resume(resume) at the end of construction; model.init_from
  // is then read only when that finds no checkpoint (`auto` in an empty checkpoint.dir), as the
  // checkpoint's weights replace it.
  Trainer(const RunConfig& cfg, Communicator& world, Backend* backend = nullptr,
          const std::string& resume = "");

  // Continues from a checkpoint: `spec` is a checkpoint directory or "auto" (the newest complete
  // checkpoint in checkpoint.dir; none there = start at step 0, with a notice). Restores weights,
  // AdamW moments and step, the data position and the step counter, so the rest of the run is
  // bit-identical to an uninterrupted one. The model shape must match (the error lists every
  // difference). Collective.
  void resume(const std::string& spec);

  // Creates the run directory, saves the resolved config, trains from the current step (0, or
  // the resumed one) to train.steps, saving checkpoints as configured, and logs. Returns the
  // stats of the steps it ran.
  std::vector<StepStats> run();

  // How run() ended: all steps done; stopped with a checkpoint because the lease's window ends
  // (resumable in the next window); or stopped because the lease was lost.
  // kSignalled: stopped on SIGTERM, SIGINT or SIGUSR1 after a checkpoint (stop_signals.h).
  enum class Outcome { kFinished, kWindowEnded, kLeaseLost, kSignalled };
  Outcome outcome() const { return outcome_; }
  const std::string& outcome_reason() const { return outcome_reason_; }

  // Saves a checkpoint of the state after `steps_done` steps into checkpoint.dir (rank 0
  // writes; ZeRO-1 moments are gathered first). Collective. Returns the seconds the save took.
  double save(int64_t steps_done);
  // Fencing token that checkpoint commits carry (set by run() while it holds a lease).
  void set_fencing_token(std::optional<int64_t> token) { fencing_token_ = token; }

  int64_t start_step() const { return start_step_; }
  // This config's plan on this machine (berth plan), made at construction; on rank 0 of a packed
  // or padded run, with the attention work and token fill of its loader's packing. Null when no
  // plan could be made.
  const Plan* preflight() const { return preflight_ ? &*preflight_ : nullptr; }
  // Bytes of heap this rank's trainer holds at most at the end of a step (heap in use then,
  // minus before the trainer was constructed; sampled after its first two steps and every
  // progress.interval-th): the figure the plan's memory is checked against.
  double held_bytes() const { return heap_peak_ - heap_baseline_; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }

  // One optimizer step (used by run and by tests).
  StepStats train_step(int64_t step);

  // Mean loss per target token over eval.batches global batches of sequential validation
  // windows (from the start of the validation set each time); requires data.val. Collective.
  double evaluate();

  // This rank's part of the model (its tp slice of its pipeline stage).
  GPT<float>& model() { return *model_; }
  // The whole model's parameters in gpt_param_layout(model) order at the plain vocabulary
  // padding, assembled from every rank on rank 0 (empty elsewhere). Collective.
  std::vector<float> full_params();
  const std::string& run_dir() const { return run_dir_; }
  ProcessGrid& grid() { return *grid_; }

 private:
  void sync_and_update(double lr, StepStats* st);
  // A whole-model buffer (parameters or moments, this rank's layout) → full tensors on rank 0.
  std::vector<float> gather_full(const std::vector<float>& local);
  // ZeRO-1: this rank's moment shards → the whole layout's moments on the dp = cp = 0 rank of
  // its tp and pp coordinate (gather_full's holder); the others keep their shards. Collective
  // over the dp × cp group.
  void gather_moment_shards(std::vector<float>* m, std::vector<float>* v);
  // Throws (on every rank) unless every rank's resolved config is rank 0's. Collective.
  void require_same_config_on_every_rank();
  // Warns (rank 0) when the data order or the learning-rate schedule differ from the run that
  // saved the checkpoint at `path` (describe_resume_changes).
  void warn_resume_changes(const std::string& path, const CheckpointMeta& meta) const;
  // Full tensors (a checkpoint's, at its padding `from`) → this rank's slice.
  std::vector<float> local_from_full(const std::vector<float>& full, const GPTConfig& from) const;

  RunConfig cfg_;
  Communicator& world_;  // MPI: host-side control (decisions, checkpoints, metrics)
  std::unique_ptr<Backend> own_backend_;       // run.device's backend, unless one was given
  Backend* backend_ = nullptr;                 // where the model runs
  std::unique_ptr<Communicator> device_world_;  // NCCL over the same ranks with the CUDA backend
  std::unique_ptr<ProcessGrid> grid_;           // on device_world_ when it exists, else world_
  GPTConfig gcfg_;       // the model as trained (vocabulary padded to 128·tp)
  GPTConfig canonical_;  // the same at the plain padding (128): checkpoints, FLOPs
  ModelShard shard_;
  std::vector<PipeAction> train_actions_;  // this stage's schedule of one step
  LrSchedule schedule_;
  TokenDataset train_ds_, val_ds_;
  std::unique_ptr<GPT<float>> model_;
  std::unique_ptr<AdamW> opt_;
  // The training data's loader, or with `eval` the validation data's (read in order; packed
  // modes: its plan, packed_plan_path, in eval_pack_options' fixed document order).
  std::unique_ptr<BatchSource> make_loader(const TokenDataset* ds, const std::string& path,
                                           bool eval);

  std::unique_ptr<BatchSource> loader_, val_loader_;
  std::string data_summary_;  // how the training data is laid out, logged at start
  std::vector<PackedBatch> batches_;  // one per micro-batch
  std::vector<PackedBatch> cp_batches_;  // cp > 1: this rank's zigzag shard of each micro-batch
  std::vector<PackedBatch> val_batches_, cp_val_batches_;
  // Reads the evaluation's batches from the start of data.val into val_batches_, once: every
  // evaluation reads the same windows. Sets eval_batches_ (this rank's model batches of them) and
  // eval_targets_ (the target tokens of all of them over the dp×cp group). Collective.
  void load_eval_batches();
  std::vector<const PackedBatch*> eval_batches_;
  int64_t eval_targets_ = 0;
  PackedBatch& model_batch(PackedBatch& full, PackedBatch& local);
  DeviceBuffer<float> shard_grads_;   // ZeRO-1: this rank's reduced gradient shard
  std::vector<size_t> shard_counts_;  // ZeRO-1: elements per dp×cp rank
  double flops_per_token_ = 0;
  std::string run_dir_, checkpoint_dir_;
  std::unique_ptr<RunDirLock> run_lock_;   // rank 0, until run() ends
  std::unique_ptr<RunDirLock> ckpt_lock_;  // the same, of checkpoint.dir (lock_checkpoint_dir)
  void lock_run_dir();                     // rank 0: takes run_lock_ (the directory exists)
  void lock_checkpoint_dir();              // rank 0; once
  // Rank 0, before a save: takes checkpoint.dir (its lock) again when it was removed or replaced.
  void relock_checkpoint_dir_if_gone(int64_t step);
  // Rank 0: takes the run directory (its lock, config.toml) again when it was removed; true if
  // so. `before`: what for, in the warning.
  bool relock_run_dir_if_gone(const std::string& before);
  // Rank 0, when metrics.jsonl (all of `metrics`) could not be committed (`why`): writes the
  // records beside the checkpoints, else into the temporary directory, and throws saying where.
  [[noreturn]] void rescue_metrics(const std::string& metrics, const std::string& why) const;
  // At a relaunch that finds the run complete but metrics.jsonl short of its last step (killed
  // after its last save): says which file holds the records and which are lost (rank 0).
  void warn_uncommitted_metrics() const;
  // Whether this launch trains under a lease (a reservation, or one booked on demand).
  bool leased() const { return cfg_.reservation.id > 0 || cfg_.reservation.without == "on-demand"; }
  int64_t start_step_ = 0;
  std::string resumed_from_;  // the checkpoint resume() loaded ("": none)
  void load_init_from();      // model.init_from's weights, with a fresh optimizer
  // Whether this run's config saves a checkpoint after global step `step` (checkpoint.interval,
  // checkpoint.final).
  bool saves_at(int64_t step) const;
  std::vector<std::vector<char>> leaked_;  // debug.leak_mib_per_step
  std::optional<int64_t> fencing_token_;
  double heap_baseline_ = 0, heap_peak_ = 0;
  int64_t steps_run_ = 0;  // train_step calls of this trainer
  int64_t skipped_steps_ = 0;
  std::string data_fingerprint_;   // of data.train (dataset_fingerprint), saved with checkpoints
  std::optional<Plan> preflight_;  // this config's plan on this machine (berth plan), if made
  std::string preflight_error_;    // why not
  Outcome outcome_ = Outcome::kFinished;
  std::string outcome_reason_;
};

// The dataset `key` ("data.train" or "data.val") must fit the model and the config: vocab_size <=
// model.vocab_size, enough tokens (one stream window; 2 in packed and padded modes), a /loss_mask
// with some targets (and a warning that stream mode does not apply it), some document kept under
// data.long_docs = "drop".
void check_dataset_fits(const TokenDataset& ds, const char* key, const RunConfig& cfg);

// The config's parallel layout on `world` ranks (resolve_grid), the debug.*_rank faults, and what
// context parallelism needs of data.seq_len and data.pack_align. Pure: `berth train` runs it in
// its start-up vote, so a layout every rank refuses ends the job with one message and no
// MPI_Abort, and the trainer runs it again for its other callers.
GridShape check_layout(const RunConfig& cfg, int world);

// data.train exists, and data.val when something evaluates; else a specific error naming the key
// (and, for a relative path, the directory it is read from). A data.pack_plan there packed for
// another run is refused (require_named_plan_is_this_runs). Pure: `berth train` runs it in its
// start-up vote, so a dataset missing on every rank ends the job with one message and no
// MPI_Abort (the trainer runs it again for its other callers).
void check_data_files(const RunConfig& cfg);

}  // namespace berth
