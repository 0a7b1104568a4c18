// Packed and padded data modes: rows built from a packing plan (packing/packers.h).
//
// Row layout: the plan's pieces one after another, each a sequence of its own (cu_seqlens entry,
// positions restarting at 0), then padding to T as one more sequence (tokens = the dataset's EOT,
// or 0 without one; targets -1). Targets: the next token of the document; at a document's last
// token the EOT right after the document where one follows and the document does not end with
// its own (EOT-first layouts, such as llm.c's), else -1 (no prediction across documents); a piece
// cut from a long document keeps its true next token as the target of its last position. With a
// dataset /loss_mask, a target is kept only where loss_mask of the target token is 1 (SFT: train on
// response tokens only).
//
// Rows are visited in plan order, or in a seeded permutation per epoch with shuffle. Data
// parallelism works as for the stream loader: replica d of n keeps rows [d·B, d·B + B) of every
// n·B global rows.
#pragma once

#include <cstdint>
#include <vector>

#include "packing/packed_batch.h"
#include "packing/packers.h"
#include "runtime/config/config.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/data_loader.h"

namespace berth {

// Fills `batch` (resized to rows.size() × T) with the plan rows `rows`. Each token's target is the
// next token of its document (none where /loss_mask is 0 for that token),
// and a document's last token predicts an EOT right after the document when the document does
// not end with one itself (EOT-first layouts such as llm.c's).
void fill_packed_rows(const TokenDataset& ds, const PackPlan& plan, const std::vector<int64_t>& rows,
                      int T, PackedBatch* batch);

class PackedLoader : public BatchSource {
 public:
  // Throws Error when the plan has no rows.
  PackedLoader(const TokenDataset* ds, PackPlan plan, int B, int T, bool shuffle, uint64_t seed,
               StreamLoader::Shard shard = {0, 1});

  void next(PackedBatch* batch) override;
  int64_t rows_consumed() const override { return rows_; }
  void set_rows_consumed(int64_t rows) override { rows_ = rows; }
  int64_t rows_per_epoch() const override { return plan_.n_rows(); }

  const PackPlan& plan() const { return plan_; }
  int64_t row_of(int64_t global_row) const;  // plan row of the global_row-th row drawn

 private:
  const TokenDataset* ds_;
  PackPlan plan_;
  int B_, T_;
  bool shuffle_;
  uint64_t seed_;
  StreamLoader::Shard shard_;
  int64_t rows_ = 0;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
  std::vector<int64_t> row_ids_;
};

// Document lengths of a dataset (pack_documents' input).
std::vector<int64_t> document_lengths(const TokenDataset& ds);

// The packing options of a run config (data.mode "packed" or "padded") for `cp` context-parallel
// ranks: algorithm, window, long documents, seed, and the alignment (data.pack_align; automatic:
// 2·cp under context parallelism, else 1).
PackOptions pack_options(const RunConfig& cfg, int cp);
// The same for the evaluation data: its documents in one fixed order (seed kEvalPackSeed), not
// the run.seed order, so the val loss of given weights is one number whatever the seed (a seed
// sweep's val curves compare).
constexpr uint64_t kEvalPackSeed = 0;
PackOptions eval_pack_options(const RunConfig& cfg, int cp);
// Where the plan of `data_path` is cached: data.pack_plan for the training data when set, else
// <data_path>.plan-<algorithm>-T<seq_len>[-a<align>].h5, and for the evaluation's plan (`eval`)
// <data_path>.plan-<algorithm>-T<seq_len>[-a<align>]-eval.h5 (a data.val that is also a
// data.train keeps both plans).
std::string packed_plan_path(const RunConfig& cfg, const std::string& data_path,
                             const PackOptions& o, bool eval = false);

// A plan the config names (data.pack_plan) is the user's (made by `berth pack`, shared by runs):
// one there that reads but was packed with other options `o` or for other documents than
// data.train's (`doc_offsets`, or read from data.train when null and a plan is there)
// is refused, not rebuilt over (Error naming what differs and the `berth pack` command that packs
// it for this run). Nothing when data.pack_plan is empty, the file is absent (the plan is written
// there) or unreadable (rebuilt), or it matches.
void require_named_plan_is_this_runs(const RunConfig& cfg, const PackOptions& o,
                                     const std::vector<uint64_t>* doc_offsets = nullptr);

}  // namespace berth
