// Stream-mode data loader: the dataset's token stream (documents concatenated in order, EOT tokens
// included) cut into consecutive windows of T+1 tokens that overlap by one (inputs and targets
// shifted by one).
//
// Window w covers tokens [w·T, w·T + T] (inputs the first T, targets the last T); there are
// W = (n_tokens − 1) / T windows. Rows are drawn in order: row r of step k is window
// (k·B + r) mod W, i.e. tokens [s + r·T, s + r·T + T) with s advancing by B·T per step and wrapping
// at the end. With shuffle, each epoch (every W rows) uses its own seeded permutation of the
// windows, so every window is seen once per epoch.
//
// Data parallelism: with `shard = {index, count}` the loader is one of `count` replicas. Each
// call draws the next count·B global rows and keeps rows [index·B, index·B + B) of them, so the
// replicas together read exactly the rows — in the same order — that one loader with count·B rows
// per call would read.
//
// The position is one integer (global rows consumed), so a checkpoint can store it and resume
// exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "packing/packed_batch.h"
#include "runtime/io/token_dataset.h"

namespace berth {

// What the trainer draws batches from: a position (global rows consumed) and the next batch.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void next(PackedBatch* batch) = 0;
  virtual int64_t rows_consumed() const = 0;
  virtual void set_rows_consumed(int64_t rows) = 0;
  virtual int64_t rows_per_epoch() const = 0;  // global rows in one pass over the data
};

class StreamLoader : public BatchSource {
 public:
  // Throws Error when the dataset has fewer than T+1 tokens.
  struct Shard {
    int index = 0, count = 1;
  };
  StreamLoader(const TokenDataset* ds, int B, int T, bool shuffle, uint64_t seed,
               Shard shard = {0, 1});

  // Fills `batch` with this replica's B rows of the next count·B global rows and advances the
  // position by count·B.
  void next(PackedBatch* batch) override;

  int64_t n_windows() const { return n_windows_; }
  int64_t rows_consumed() const override { return rows_; }
  void set_rows_consumed(int64_t rows) override { rows_ = rows; }
  int64_t rows_per_epoch() const override { return n_windows_; }

  // Window index (into the un-shuffled order) of the `row`-th row ever drawn. Pure.
  int64_t window_of_row(int64_t row) const;

 private:
  void build_permutation(int64_t epoch) const;

  const TokenDataset* ds_;
  int B_, T_;
  Shard shard_;
  bool shuffle_;
  uint64_t seed_;
  int64_t n_windows_;
  int64_t rows_ = 0;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace berth
