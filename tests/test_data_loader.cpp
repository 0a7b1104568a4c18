// StreamLoader (runtime/train/data_loader.h) and PackedBatch invariants (packing/packed_batch.h):
// window arithmetic, wrap-around, exact resume, per-epoch shuffling, and check_invariants
// accepting loader output and rejecting each broken invariant.
//
// The datasets are hand-made with token i == i, so a row's first token names its window
// (window = first token / T) and every expectation is exact integer equality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "packing/packed_batch.h"
#include "runtime/core/check.h"
#include "tests/expect_error.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/data_loader.h"

namespace berth {
namespace {

// ---- helpers ------------------------------------------------------------------------------------

// One document of n tokens with token i == i (vocab n, so every id is in range).
TokenDataset counting_dataset(int64_t n) {
  TokenDataset ds;
  ds.tokens.resize(size_t(n));
  std::iota(ds.tokens.begin(), ds.tokens.end(), uint32_t{0});
  ds.doc_offsets = {0, uint64_t(n)};
  ds.vocab_size = n;
  ds.tokenizer = "test-counting";
  return ds;
}

using test::expect_error;

// The window of each row of `batch`, read back from the tokens (token i == i).
std::vector<int64_t> windows_in_batch(const PackedBatch& batch) {
  std::vector<int64_t> w;
  for (int r = 0; r < batch.B; r++)
    w.push_back(batch.tokens[size_t(r) * size_t(batch.T)] / batch.T);
  return w;
}

// Draws `n_rows` rows (a whole number of batches) and returns the window of each, in order.
std::vector<int64_t> draw_windows(StreamLoader* loader, int B, int64_t n_rows) {
  EXPECT_EQ(n_rows % B, 0);
  std::vector<int64_t> out;
  PackedBatch batch;
  for (int64_t i = 0; i < n_rows / B; i++) {
    loader->next(&batch);
    const std::vector<int64_t> w = windows_in_batch(batch);
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

// ---- window arithmetic --------------------------------------------------------------------------

TEST(StreamLoader, WindowCountIsNMinusOneOverT) {
  const int T = 8;
  const struct {
    int64_t n;
    int64_t windows;
  } cases[] = {{T + 1, 1}, {2 * T, 1}, {2 * T + 1, 2}, {10 * T + 1, 10}, {10 * T + 7, 10}};
  for (const auto& c : cases) {
    const TokenDataset ds = counting_dataset(c.n);
    const StreamLoader loader(&ds, 1, T, false, 0);
    EXPECT_EQ(loader.n_windows(), c.windows) << "n_tokens " << c.n;
  }
}

// Step k row r holds tokens [s + r·T, s + r·T + T) with s = k·B·T (mod the W windows), targets
// shifted by one; B = 5 does not divide W = 12, so epochs end in the middle of a batch.
TEST(StreamLoader, RowsAreConsecutiveWindowsAndWrap) {
  const int B = 5, T = 8;
  const int64_t W = 12;
  const TokenDataset ds = counting_dataset(W * T + 1);  // the last target is the last token
  StreamLoader loader(&ds, B, T, false, 0);
  ASSERT_EQ(loader.n_windows(), W);
  PackedBatch batch;
  for (int64_t k = 0; k < 7; k++) {  // 35 rows: almost 3 epochs
    loader.next(&batch);
    ASSERT_EQ(batch.B, B);
    ASSERT_EQ(batch.T, T);
    for (int r = 0; r < B; r++) {
      const int64_t start = ((k * B + r) % W) * T;
      for (int t = 0; t < T; t++) {
        const size_t i = size_t(r) * T + size_t(t);
        ASSERT_EQ(batch.tokens[i], start + t) << "step " << k << " row " << r << " t " << t;
        ASSERT_EQ(batch.targets[i], start + t + 1) << "step " << k << " row " << r << " t " << t;
      }
    }
    EXPECT_EQ(loader.rows_consumed(), (k + 1) * B);
  }
}

// More rows per batch than windows: the stream wraps inside one batch.
TEST(StreamLoader, WrapsInsideABatchWhenBExceedsWindows) {
  const int B = 5, T = 4;
  const TokenDataset ds = counting_dataset(2 * T + 1);  // W = 2
  StreamLoader loader(&ds, B, T, false, 0);
  PackedBatch batch;
  loader.next(&batch);
  EXPECT_EQ(windows_in_batch(batch), (std::vector<int64_t>{0, 1, 0, 1, 0}));
  loader.next(&batch);
  EXPECT_EQ(windows_in_batch(batch), (std::vector<int64_t>{1, 0, 1, 0, 1}));
}

TEST(StreamLoader, TooSmallDatasetIsAnErrorNamingSeqLen) {
  const int T = 16;
  const TokenDataset ds = counting_dataset(T);  // needs T + 1
  expect_error([&] { StreamLoader(&ds, 2, T, false, 0); }, {"seq_len", "16 tokens"});
  const TokenDataset empty = counting_dataset(0);
  expect_error([&] { StreamLoader(&empty, 2, T, true, 0); }, {"seq_len"});
  const TokenDataset just_enough = counting_dataset(T + 1);
  EXPECT_NO_THROW(StreamLoader(&just_enough, 2, T, false, 0));
}

TEST(StreamLoader, NonPositiveShapeIsAnError) {
  const TokenDataset ds = counting_dataset(100);
  expect_error([&] { StreamLoader(&ds, 0, 8, false, 0); }, {"micro_batch_size"});
  expect_error([&] { StreamLoader(&ds, 2, 0, false, 0); }, {"seq_len"});
  expect_error([&] { StreamLoader(&ds, -1, 8, false, 0); }, {"micro_batch_size"});
}

// ---- resume -------------------------------------------------------------------------------------

// A fresh loader positioned with set_rows_consumed(rows_consumed()) of another produces the
// identical next batches, in stream order and shuffled (resume in a later epoch than the first).
TEST(StreamLoader, SetRowsConsumedResumesToTheIdenticalNextBatch) {
  const int B = 3, T = 4;
  const TokenDataset ds = counting_dataset(11 * T + 3);  // W = 11, coprime with B
  for (const bool shuffle : {false, true}) {
    StreamLoader original(&ds, B, T, shuffle, 42);
    PackedBatch a, b;
    for (int k = 0; k < 9; k++) original.next(&a);  // 27 rows: inside epoch 2
    const int64_t rows = original.rows_consumed();
    ASSERT_EQ(rows, 27);

    StreamLoader resumed(&ds, B, T, shuffle, 42);
    resumed.set_rows_consumed(rows);
    EXPECT_EQ(resumed.rows_consumed(), rows);
    for (int k = 0; k < 8; k++) {  // crosses the next epoch boundary too
      original.next(&a);
      resumed.next(&b);
      EXPECT_EQ(a.tokens, b.tokens) << "shuffle " << shuffle << " batch " << k;
      EXPECT_EQ(a.targets, b.targets) << "shuffle " << shuffle << " batch " << k;
      EXPECT_EQ(a.positions, b.positions);
      EXPECT_EQ(a.cu_seqlens, b.cu_seqlens);
    }
    EXPECT_EQ(original.rows_consumed(), resumed.rows_consumed());
  }
}

// Rewinding the same loader (as Trainer::evaluate does) replays the stream from that row.
TEST(StreamLoader, RewindingReplaysTheStream) {
  const int B = 2, T = 4;
  const TokenDataset ds = counting_dataset(7 * T + 1);
  StreamLoader loader(&ds, B, T, true, 7);
  const std::vector<int64_t> first = draw_windows(&loader, B, 20);
  loader.set_rows_consumed(0);
  EXPECT_EQ(draw_windows(&loader, B, 20), first);
  loader.set_rows_consumed(6);
  const std::vector<int64_t> tail = draw_windows(&loader, B, 14);
  EXPECT_EQ(tail, std::vector<int64_t>(first.begin() + 6, first.end()));
}

// ---- shuffle ------------------------------------------------------------------------------------

TEST(StreamLoader, ShuffledEpochIsAPermutationOfAllWindows) {
  const int B = 4, T = 4;
  const int64_t W = 13;  // B does not divide W: epoch boundaries fall inside batches
  const TokenDataset ds = counting_dataset(W * T + 2);
  StreamLoader loader(&ds, B, T, true, 1337);
  ASSERT_EQ(loader.n_windows(), W);
  const int64_t epochs = 4;
  const std::vector<int64_t> rows = draw_windows(&loader, B, epochs * W);  // 52 = 13 batches

  std::vector<int64_t> identity(static_cast<size_t>(W));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  std::vector<std::vector<int64_t>> orders;
  for (int64_t e = 0; e < epochs; e++) {
    std::vector<int64_t> order(rows.begin() + e * W, rows.begin() + (e + 1) * W);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "epoch " << e << " is not a permutation of the windows";
    EXPECT_NE(order, identity) << "epoch " << e << " is not shuffled";
    for (int64_t r = 0; r < W; r++) {
      EXPECT_EQ(loader.window_of_row(e * W + r), order[size_t(r)]) << "epoch " << e << " row " << r;
    }
    orders.push_back(order);
  }
  for (size_t e = 1; e < orders.size(); e++) {
    EXPECT_NE(orders[e], orders[e - 1]) << "epochs " << e - 1 << " and " << e << " repeat";
  }
}

// Data-parallel shards: replica d of n keeps rows [d·B, d·B + B) of every n·B global rows, so the
// replicas together read exactly what one loader with n·B rows reads, in the same order.
TEST(StreamLoader, ShardsTogetherReadTheRowsOfOneWideLoader) {
  const int B = 2, T = 4, n = 3;
  const TokenDataset ds = counting_dataset(17 * T + 1);  // 17 windows: shards wrap mid-batch
  for (bool shuffle : {false, true}) {
    StreamLoader wide(&ds, n * B, T, shuffle, 5);
    std::vector<StreamLoader> parts;
    for (int d = 0; d < n; d++) parts.emplace_back(&ds, B, T, shuffle, 5, StreamLoader::Shard{d, n});
    PackedBatch all, part;
    for (int step = 0; step < 9; step++) {
      wide.next(&all);
      for (int d = 0; d < n; d++) {
        parts[size_t(d)].next(&part);
        for (int i = 0; i < B * T; i++) {
          ASSERT_EQ(part.tokens[size_t(i)], all.tokens[size_t(d * B * T + i)])
              << "shuffle " << shuffle << " step " << step << " replica " << d << " token " << i;
          ASSERT_EQ(part.targets[size_t(i)], all.targets[size_t(d * B * T + i)]);
        }
        EXPECT_EQ(parts[size_t(d)].rows_consumed(), wide.rows_consumed());
      }
    }
  }
  EXPECT_THROW(StreamLoader(&ds, B, T, false, 5, StreamLoader::Shard{3, 3}), Error);
}

// Shuffled rows still carry whole windows: tokens [w·T, w·T + T), targets shifted by one.
TEST(StreamLoader, ShuffledRowsAreWholeWindows) {
  const int B = 3, T = 5;
  const TokenDataset ds = counting_dataset(9 * T + 1);
  StreamLoader loader(&ds, B, T, true, 3);
  PackedBatch batch;
  for (int k = 0; k < 6; k++) {
    loader.next(&batch);
    for (int r = 0; r < B; r++) {
      const int64_t start = loader.window_of_row(int64_t(k) * B + r) * T;
      for (int t = 0; t < T; t++) {
        const size_t i = size_t(r) * T + size_t(t);
        ASSERT_EQ(batch.tokens[i], start + t);
        ASSERT_EQ(batch.targets[i], start + t + 1);
      }
    }
  }
}

TEST(StreamLoader, ShuffleOrderDependsOnlyOnTheSeed) {
  const int B = 2, T = 4;
  const int64_t W = 16;
  const TokenDataset ds = counting_dataset(W * T + 1);
  StreamLoader a(&ds, B, T, true, 99), b(&ds, B, T, true, 99), c(&ds, B, T, true, 100);
  const std::vector<int64_t> wa = draw_windows(&a, B, 3 * W);
  EXPECT_EQ(draw_windows(&b, B, 3 * W), wa) << "same seed, different order";
  const std::vector<int64_t> wc = draw_windows(&c, B, 3 * W);
  for (int64_t e = 0; e < 3; e++) {
    EXPECT_NE(std::vector<int64_t>(wa.begin() + e * W, wa.begin() + (e + 1) * W),
              std::vector<int64_t>(wc.begin() + e * W, wc.begin() + (e + 1) * W))
        << "seeds 99 and 100 give the same order in epoch " << e;
  }
}

TEST(StreamLoader, NoShuffleIgnoresTheSeed) {
  const int B = 2, T = 4;
  const TokenDataset ds = counting_dataset(6 * T + 1);
  StreamLoader a(&ds, B, T, false, 1), b(&ds, B, T, false, 2);
  const std::vector<int64_t> wa = draw_windows(&a, B, 12);
  EXPECT_EQ(wa, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(draw_windows(&b, B, 12), wa);
}

// ---- batch layout and invariants ----------------------------------------------------------------

TEST(StreamLoader, PositionsAndCuSeqlensMarkOneSequencePerRow) {
  const int B = 3, T = 6;
  const TokenDataset ds = counting_dataset(10 * T + 1);
  StreamLoader loader(&ds, B, T, true, 5);
  PackedBatch batch;  // default-constructed: next() sizes it
  for (int k = 0; k < 4; k++) {
    loader.next(&batch);
    ASSERT_EQ(batch.N(), B * T);
    ASSERT_EQ(batch.tokens.size(), size_t(B * T));
    ASSERT_EQ(batch.targets.size(), size_t(B * T));
    ASSERT_EQ(batch.positions.size(), size_t(B * T));
    for (int i = 0; i < B * T; i++) EXPECT_EQ(batch.positions[size_t(i)], i % T) << "token " << i;
    ASSERT_EQ(batch.n_seqs(), B);
    for (int r = 0; r <= B; r++) EXPECT_EQ(batch.cu_seqlens[size_t(r)], r * T) << "boundary " << r;
    EXPECT_EQ(batch.max_seqlen, T);
    EXPECT_EQ(batch.n_targets(), int64_t(B) * T);  // stream mode: every token predicts the next
    EXPECT_NO_THROW(check_invariants(batch, ds.vocab_size, T));
  }
}

// A batch of another shape is resized to the loader's B×T.
TEST(StreamLoader, ResizesABatchOfAnotherShape) {
  const int B = 2, T = 4;
  const TokenDataset ds = counting_dataset(5 * T + 1);
  StreamLoader loader(&ds, B, T, false, 0);
  PackedBatch batch;
  reset_rows(&batch, 5, 7);
  loader.next(&batch);
  EXPECT_EQ(batch.B, B);
  EXPECT_EQ(batch.T, T);
  EXPECT_NO_THROW(check_invariants(batch, ds.vocab_size, T));
  EXPECT_EQ(windows_in_batch(batch), (std::vector<int64_t>{0, 1}));
}

class PackedBatchInvariants : public ::testing::Test {
 protected:
  static constexpr int kB = 3, kT = 4;
  static constexpr int64_t kVocab = 50;

  void SetUp() override {
    ds_ = counting_dataset(kVocab);
    StreamLoader loader(&ds_, kB, kT, false, 0);
    loader.next(&batch_);
    ASSERT_NO_THROW(check_invariants(batch_, kVocab, kT));
  }

  void expect_rejected(const PackedBatch& b, const std::vector<std::string>& parts) {
    expect_error([&] { check_invariants(b, kVocab, kT); }, parts);
  }

  TokenDataset ds_;
  PackedBatch batch_;
};

TEST_F(PackedBatchInvariants, AcceptsMaskedTargetsAndBoundaryValues) {
  PackedBatch b = batch_;
  b.targets[0] = -1;  // "no prediction here"
  b.tokens[1] = int32_t(kVocab - 1);
  b.targets[1] = int32_t(kVocab - 1);
  EXPECT_NO_THROW(check_invariants(b, kVocab, kT));
  EXPECT_EQ(b.n_targets(), int64_t(kB) * kT - 1);
}

TEST_F(PackedBatchInvariants, AcceptsSeveralSequencesInARow) {
  PackedBatch b = batch_;  // row 1 split into two sequences of 2: positions 0 1 0 1
  b.cu_seqlens = {0, kT, kT + 2, 2 * kT, 3 * kT};
  b.positions[size_t(kT) + 2] = 0;
  b.positions[size_t(kT) + 3] = 1;
  EXPECT_NO_THROW(check_invariants(b, kVocab, kT));
}

TEST_F(PackedBatchInvariants, RejectsPositionNotRestartingAtARowStart) {
  PackedBatch b = batch_;
  b.positions[size_t(kT)] = kT;  // row 1 continues row 0's count
  expect_rejected(b, {"position", "expected 0"});
}

TEST_F(PackedBatchInvariants, RejectsPositionNotIncreasingByOne) {
  PackedBatch b = batch_;
  b.positions[2] = 3;
  expect_rejected(b, {"position 3 at token 2, expected 2"});
}

TEST_F(PackedBatchInvariants, RejectsPositionNotRestartingAtASequenceStart) {
  PackedBatch b = batch_;  // a boundary inside row 1 but positions running on
  b.cu_seqlens = {0, kT, kT + 2, 2 * kT, 3 * kT};
  expect_rejected(b, {"position 2 at token 6, expected 0"});
}

TEST_F(PackedBatchInvariants, RejectsCuSeqlensNotCoveringARowStart) {
  PackedBatch b = batch_;
  b.cu_seqlens = {0, 2 * kT, 3 * kT};  // rows 0 and 1 merged into one sequence
  expect_rejected(b, {"row start 4 is not a sequence boundary"});
}

TEST_F(PackedBatchInvariants, RejectsCuSeqlensNotRunningFromZeroToN) {
  PackedBatch b = batch_;
  b.cu_seqlens.back() = 3 * kT - 1;
  expect_rejected(b, {"cu_seqlens must run from 0 to N"});
  b = batch_;
  b.cu_seqlens.front() = 1;
  expect_rejected(b, {"cu_seqlens must run from 0 to N"});
  b = batch_;
  b.cu_seqlens = {0};
  expect_rejected(b, {"cu_seqlens must run from 0 to N"});
}

TEST_F(PackedBatchInvariants, RejectsDecreasingCuSeqlens) {
  PackedBatch b = batch_;
  b.cu_seqlens = {0, kT, 2 * kT, kT, 3 * kT};
  expect_rejected(b, {"cu_seqlens[3] = 4"});
}

// Boundaries after the one that reaches N are checked too (no token visits them): a decreasing
// tail or an entry beyond N would give a consumer a sequence of negative length or past the end.
TEST_F(PackedBatchInvariants, RejectsCuSeqlensBrokenAfterTheLastToken) {
  PackedBatch b = batch_;
  b.cu_seqlens = {0, kT, 2 * kT, 3 * kT, 2 * kT, 3 * kT};  // sequence 3 = [12, 8)
  expect_rejected(b, {"cu_seqlens[4] = 8"});
  b = batch_;
  b.cu_seqlens = {0, kT, 2 * kT, 3 * kT, 4 * kT, 3 * kT};  // 16 > N = 12
  expect_rejected(b, {"cu_seqlens[4] = 16"});
}

TEST_F(PackedBatchInvariants, RejectsTokenOutsideVocab) {
  PackedBatch b = batch_;
  b.tokens[5] = int32_t(kVocab);
  expect_rejected(b, {"token 50 at 5 outside [0, 50)"});
  b = batch_;
  b.tokens[0] = -1;
  expect_rejected(b, {"token -1 at 0 outside [0, 50)"});
}

TEST_F(PackedBatchInvariants, RejectsTargetOutsideMinusOneToVocab) {
  PackedBatch b = batch_;
  b.targets[7] = -2;
  expect_rejected(b, {"target -2 at 7 outside [-1, 50)"});
  b = batch_;
  b.targets[7] = int32_t(kVocab);
  expect_rejected(b, {"target 50 at 7 outside [-1, 50)"});
}

TEST_F(PackedBatchInvariants, RejectsSizeMismatch) {
  PackedBatch b = batch_;
  b.tokens.pop_back();
  expect_rejected(b, {"sizes 11/12/12 != B*T = 12"});
  b = batch_;
  b.targets.push_back(0);
  expect_rejected(b, {"sizes 12/13/12 != B*T = 12"});
  b = batch_;
  b.positions.pop_back();
  expect_rejected(b, {"sizes 12/12/11 != B*T = 12"});
}

TEST_F(PackedBatchInvariants, RejectsPositionBeyondMaxPositions) {
  expect_error([&] { check_invariants(batch_, kVocab, kT - 1); },
               {"position 3", ">= max positions 3"});
}

TEST_F(PackedBatchInvariants, RejectsMaxSeqlenBelowTheLongestSequence) {
  PackedBatch b = batch_;
  b.max_seqlen = kT - 1;
  expect_rejected(b, {"max_seqlen 3 < longest sequence 4"});
}

TEST_F(PackedBatchInvariants, RejectsNonPositiveShape) {
  PackedBatch b = batch_;
  b.B = 0;
  expect_rejected(b, {"must be positive"});
}

}  // namespace
}  // namespace berth
