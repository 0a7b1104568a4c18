// Checkpoints: a directory per saved step, written atomically, readable at another layout.
//
// Layout of a checkpoint directory (format "berth-checkpoint", format_version 1):
//   model.h5       one float32 dataset per parameter, named as in the model (wte, h.3.attn.c_attn.
//                  weight, ...), with attributes full_shape (int64[]) and offset (int64[], where
//                  this slice starts in the full tensor; zeros for a whole tensor). Fletcher-32
//                  checksums on every dataset, so corruption is an error on read, not bad weights.
//                  Root attributes: format, format_version, n_layer, n_head, d_model, vocab_size,
//                  padded_vocab_size, max_seq_len.
//   optimizer.h5   (absent in a weights-only checkpoint) the AdamW moments as datasets m/<name>,
//                  v/<name> with the same attributes, and the root attribute adam_step.
//   meta.json      written last: format, format_version, step (completed optimizer steps), the
//                  resolved config (TOML text), data position (rows_consumed), seed, the parallel
//                  layout it was saved from, fencing_token (null until the reservation lease
//                  fills it), and the save time.
// The directory is first written as <final>.tmp-<pid> and renamed to <final> only when
// complete, so a crash leaves either the previous checkpoints or a *.tmp-* directory that
// clean_partial_checkpoints() removes on the next start.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/model/gpt_config.h"

namespace berth {

constexpr const char* kCheckpointFormat = "berth-checkpoint";
constexpr int64_t kCheckpointFormatVersion = 1;

// A checkpoint that is damaged: a file missing or unreadable, a checksum that fails, contents
// that disagree with each other. Not one that does not exist, is of another format version or
// holds another model (those are Error).
struct DamagedCheckpoint : Error {
  using Error::Error;
};

struct CheckpointMeta {
  int64_t step = 0;           // completed optimizer steps (the next step to run)
  int64_t rows_consumed = 0;  // global data-loader position
  int64_t seed = 0;
  int64_t rows_per_step =
      0;  // global rows of one optimizer step (dp × micro-batch × micro-batches;
          // 0 = unknown: written before berth recorded it, or an import)
  std::string config_toml;    // resolved config of the run that saved it ("" for imports)
  std::string layout;         // e.g. "dp=2 tp=1 pp=1 cp=1 (2 ranks)", informational
  std::optional<int64_t> fencing_token;
  std::string source;         // what produced it: "berth train", "import llmc FILE", ...
  // Steps taken without an update (a global batch with no targets): AdamW stepped
  // step − skipped_steps times.
  int64_t skipped_steps = 0;
  // dataset_fingerprint of the data.train it trained on ("" = not recorded: an import, or
  // written before berth recorded it); a resume on other data at the same path is warned about.
  std::string data_fingerprint;
};

struct CheckpointData {
  GPTConfig model;
  std::vector<float> params;  // full flat buffer in gpt_param_layout(model) order
  // Optimizer state; empty for a weights-only checkpoint (imports, init_from sources).
  std::vector<float> adam_m, adam_v;  // full flat buffers, same layout
  int64_t adam_step = 0;
  CheckpointMeta meta;

  bool has_optimizer() const { return !adam_m.empty(); }
};

// Writes `data` as the checkpoint directory `dir` (which must not exist yet; its parent is
// created), atomically (temporary directory + rename). `pause_before_commit_s` > 0 sleeps after
// the HDF5 files are written and before meta.json and the rename (debug hook for crash tests).
// Returns the seconds taken. Throws Error (nothing left under `dir`) on failure.
double save_checkpoint(const std::string& dir, const CheckpointData& data,
                       double pause_before_commit_s = 0);

// Reads a checkpoint directory. with_optimizer = false skips optimizer.h5. Throws Error with a
// specific message: not a checkpoint (no meta.json: incomplete or not berth's), newer
// format_version, missing or corrupt (checksum) dataset, shape that disagrees with the header.
// NaN/Inf weights are a warning naming the tensor (warn_non_finite), not an error.
CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer);

// Logs one warning per tensor of `data.params` holding NaN/Inf (name, count, first element):
// such weights train or evaluate to NaN, but a user may want to inspect or repair them, so
// loading them is not an error. load_checkpoint and the model importers call it.
void warn_non_finite(const CheckpointData& data, const ParamLayout& layout,
                     const std::string& source);

// "step-00000120" for step 120: the name of a training checkpoint inside checkpoint.dir.
std::string checkpoint_dir_name(int64_t step);
// The step of a step-NNNNNNNN name (its last path component), or -1 for any other name.
int64_t checkpoint_step(const std::string& path);

// The newest complete checkpoint (highest step with meta.json) in `checkpoint_dir`, or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir);

// Records lease token `token` in `checkpoint_dir`'s FENCE (under its lock), as a commit does:
// from then on a commit with a lower token is refused. Throws Error when a higher token already
// committed there.
void claim_checkpoint_fence(const std::string& checkpoint_dir, int64_t token);

// step-NNNNNNNN directories in `checkpoint_dir` without meta.json (not written by a save of
// berth's, which renames a complete temporary into place: copied or emptied by hand), by step.
// --resume auto passes them by, and a save of their step would fail on them. (step, path) pairs.
std::vector<std::pair<int64_t, std::string>> incomplete_checkpoints(
    const std::string& checkpoint_dir);

// Removes *.tmp-* directories left in `checkpoint_dir` by an interrupted save (not those of a
// process of this host that is still running); returns how many.
int clean_partial_checkpoints(const std::string& checkpoint_dir);

// Keeps the newest `keep_last` complete checkpoints in `checkpoint_dir` (0 = keep all); returns
// how many were removed.
int prune_checkpoints(const std::string& checkpoint_dir, int64_t keep_last);

// Explains every difference between the model shape of a checkpoint and the config's, or "" when
// they match: "n_layer: checkpoint 12, config 4; d_model: checkpoint 768, config 256".
std::string describe_shape_mismatch(const GPTConfig& checkpoint, const GPTConfig& config);

}  // namespace berth
