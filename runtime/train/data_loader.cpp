#include "runtime/train/data_loader.h"

#include <numeric>
#include <random>

#include "runtime/core/check.h"

namespace berth {

StreamLoader::StreamLoader(const TokenDataset* ds, int B, int T, bool shuffle, uint64_t seed,
                           Shard shard)
    : ds_(ds), B_(B), T_(T), shard_(shard), shuffle_(shuffle), seed_(seed) {
  BERTH_CHECK(shard.count > 0 && shard.index >= 0 && shard.index < shard.count,
              "loader shard {} of {} is invalid", shard.index, shard.count);
  BERTH_CHECK(B > 0 && T > 0, "micro_batch_size ({}) and seq_len ({}) must be positive", B, T);
  BERTH_CHECK(ds->n_tokens() >= int64_t(T) + 1,
              "the dataset has {} tokens, fewer than seq_len + 1 = {}: lower data.seq_len or use "
              "a larger dataset",
              ds->n_tokens(), T + 1);
  n_windows_ = (ds->n_tokens() - 1) / T;
}

void StreamLoader::build_permutation(int64_t epoch) const {
  if (perm_epoch_ == epoch) return;
  perm_.resize(size_t(n_windows_));
  std::iota(perm_.begin(), perm_.end(), int64_t(0));
  // Fisher–Yates with our own index draw (std::shuffle's algorithm is library-specific).
  std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(epoch) + 1);
  for (int64_t i = n_windows_ - 1; i > 0; i--) {
    const int64_t j = int64_t(gen() % uint64_t(i + 1));
    std::swap(perm_[size_t(i)], perm_[size_t(j)]);
  }
  perm_epoch_ = epoch;
}

int64_t StreamLoader::window_of_row(int64_t row) const {
  const int64_t in_epoch = row % n_windows_;
  if (!shuffle_) return in_epoch;
  build_permutation(row / n_windows_);
  return perm_[size_t(in_epoch)];
}

void StreamLoader::next(PackedBatch* batch) {
  if (batch->B != B_ || batch->T != T_) reset_rows(batch, B_, T_);
  const uint32_t* tok = ds_->tokens.data();
  for (int r = 0; r < B_; r++) {
    const int64_t start = window_of_row(rows_ + int64_t(shard_.index) * B_ + r) * T_;
    int32_t* x = batch->tokens.data() + size_t(r) * size_t(T_);
    int32_t* y = batch->targets.data() + size_t(r) * size_t(T_);
    for (int t = 0; t < T_; t++) {
      x[t] = int32_t(tok[start + t]);
      y[t] = int32_t(tok[start + t + 1]);
    }
  }
  rows_ += int64_t(shard_.count) * B_;
}

}  // namespace berth
