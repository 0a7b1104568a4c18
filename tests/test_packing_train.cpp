// Training on packed rows: documents never see each other, and the loss does not depend on how
// documents were binned. The same documents packed by BFD, next-fit and padded — so with
// different rows and different rows per batch — give the same per-document losses and the same
// summed gradients (GPT<double>: the comparison isolates the masking from fp32 summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "packing/packers.h"
#include "runtime/model/gpt.h"
#include "runtime/train/packed_loader.h"
#include "tests/tolerance.h"

namespace berth {
namespace {

constexpr int kT = 24, kVocab = 40;

TokenDataset documents() {
  TokenDataset ds;
  ds.vocab_size = kVocab;
  ds.eot_token = kVocab - 1;
  ds.doc_offsets.push_back(0);
  std::mt19937 gen(5);
  // short and long documents; 37 and 50 are longer than T and get cut into pieces
  for (int len : {3, 17, 5, 24, 9, 37, 1, 12, 8, 50, 2, 20, 6, 11}) {
    for (int i = 0; i < len - 1; i++) ds.tokens.push_back(gen() % uint32_t(kVocab - 1));
    ds.tokens.push_back(uint32_t(ds.eot_token));
    ds.doc_offsets.push_back(ds.tokens.size());
  }
  return ds;
}

struct Result {
  std::map<int64_t, double> doc_loss;  // per-document sum of token losses
  int64_t targets = 0;
  std::vector<double> grads;
};

// Runs every row of the plan through the model, `rows_per_batch` rows at a time, and accumulates
// per-document losses (mapped back through the plan) and the gradient of the mean loss.
Result run_plan(const TokenDataset& ds, PackAlgorithm algorithm, int rows_per_batch) {
  PackOptions o;
  o.seq_len = kT;
  o.algorithm = algorithm;
  o.window = 4;
  o.seed = 3;
  const PackPlan plan = pack_documents(document_lengths(ds), o);
  const GPTConfig cfg = make_gpt_config(2, 2, 16, kVocab, kT);
  GPT<double> model(cfg, rows_per_batch, kT);
  model.init_weights(21);
  model.zero_grad();
  Result res;
  // total targets first: the loss is a mean over every target token of the data
  std::vector<std::vector<int64_t>> batches;
  for (int64_t r = 0; r < plan.n_rows(); r += rows_per_batch) {
    std::vector<int64_t> rows;
    for (int64_t k = r; k < std::min<int64_t>(plan.n_rows(), r + rows_per_batch); k++) rows.push_back(k);
    batches.push_back(rows);
  }
  PackedBatch b;
  for (const auto& rows : batches) {
    fill_packed_rows(ds, plan, rows, kT, &b);
    res.targets += b.n_targets();
  }
  for (const auto& rows : batches) {
    fill_packed_rows(ds, plan, rows, kT, &b);
    check_invariants(b, kVocab, kT);
    model.forward(b);
    for (size_t r = 0; r < rows.size(); r++) {
      int64_t pos = 0;
      for (int64_t p = plan.row_offsets[size_t(rows[r])]; p < plan.row_offsets[size_t(rows[r]) + 1]; p++) {
        const Piece& piece = plan.pieces[size_t(p)];
        for (int64_t j = 0; j < piece.length; j++) {
          res.doc_loss[piece.doc] += model.losses()[r * kT + size_t(pos + j)];
        }
        pos += piece.length;
      }
      for (int64_t j = pos; j < kT; j++) {
        EXPECT_EQ(b.targets[r * kT + size_t(j)], -1) << "padding must not be trained on";
      }
    }
    model.backward(b, 1.0 / double(res.targets));
  }
  res.grads = model.grads_host();
  return res;
}

TEST(PackedTraining, PerDocumentLossesAndGradientsDoNotDependOnBinning) {
  const TokenDataset ds = documents();
  const Result bfd = run_plan(ds, PackAlgorithm::BFD, 3);
  const Result nf = run_plan(ds, PackAlgorithm::NEXT_FIT, 2);
  const Result pad = run_plan(ds, PackAlgorithm::PADDED, 5);
  ASSERT_EQ(int64_t(bfd.doc_loss.size()), ds.n_docs());
  EXPECT_EQ(bfd.targets, nf.targets);
  EXPECT_EQ(bfd.targets, pad.targets);
  // every document contributes (its length − 1) predictions: none across documents
  EXPECT_EQ(bfd.targets, ds.n_tokens() - ds.n_docs());
  for (const Result* other : {&nf, &pad}) {
    std::vector<double> got, ref;
    for (const auto& [doc, loss] : bfd.doc_loss) {
      ref.push_back(loss);
      got.push_back(other->doc_loss.at(doc));
    }
    test::expect_close(got.data(), ref.data(), int64_t(ref.size()), test::kPackingF64,
                       "per-document loss");
    test::expect_close(other->grads.data(), bfd.grads.data(), int64_t(bfd.grads.size()),
                       test::kPackingF64, "summed gradients");
  }
}

TEST(PackedTraining, RowsNeverAttendAcrossDocuments) {
  // Changing one document's tokens changes no other document's losses in the same row.
  TokenDataset ds = documents();
  const Result before = run_plan(ds, PackAlgorithm::BFD, 4);
  const uint64_t d5 = ds.doc_offsets[5];
  for (uint64_t i = d5; i < ds.doc_offsets[6] - 1; i++) ds.tokens[i] = (ds.tokens[i] + 7) % (kVocab - 1);
  const Result after = run_plan(ds, PackAlgorithm::BFD, 4);
  for (const auto& [doc, loss] : before.doc_loss) {
    if (doc == 5) continue;
    EXPECT_EQ(after.doc_loss.at(doc), loss) << "document " << doc << " saw document 5";
  }
  EXPECT_NE(after.doc_loss.at(5), before.doc_loss.at(5));
}

TEST(PackedTraining, LossMaskDropsMaskedTargets) {
  TokenDataset ds = documents();
  ds.loss_mask.assign(ds.tokens.size(), 1);
  for (uint64_t i = ds.doc_offsets[1]; i < ds.doc_offsets[1] + 5; i++) ds.loss_mask[i] = 0;  // prompt
  PackOptions o;
  o.seq_len = kT;
  o.algorithm = PackAlgorithm::PADDED;
  const PackPlan plan = pack_documents(document_lengths(ds), o);
  PackedBatch b;
  std::vector<int64_t> rows(size_t(plan.n_rows()));
  for (size_t i = 0; i < rows.size(); i++) rows[i] = int64_t(i);
  fill_packed_rows(ds, plan, rows, kT, &b);
  ds.loss_mask.clear();
  PackedBatch unmasked;
  fill_packed_rows(ds, plan, rows, kT, &unmasked);
  // tokens 0..4 of document 1 are masked; token 0 starts the document and is never a target, so
  // 4 predictions disappear
  EXPECT_EQ(unmasked.n_targets() - b.n_targets(), 4);
}

TEST(PackedTraining, ADocumentsLastTokenPredictsTheEotThatOpensTheNext) {
  // llm.c files put EOT before each document (the importer starts a document at each EOT): the
  // last token of a document had no target, so packed training never learned to end one.
  TokenDataset ds;
  ds.vocab_size = kVocab;
  ds.eot_token = kVocab - 1;
  const uint32_t e = uint32_t(ds.eot_token);
  ds.tokens = {e, 5, 6,  7,  e, 8,
               9, e, 10, 11, 12};  // EOT-first documents; the last one ends the file
  ds.doc_offsets = {0, 4, 7, 11};
  PackOptions o;
  o.seq_len = kT;
  o.algorithm = PackAlgorithm::PADDED;
  o.seed = 0;
  const PackPlan plan = pack_documents(document_lengths(ds), o);
  PackedBatch b;
  std::vector<int64_t> rows(size_t(plan.n_rows()));
  for (size_t i = 0; i < rows.size(); i++) rows[i] = int64_t(i);
  fill_packed_rows(ds, plan, rows, kT, &b);
  check_invariants(b, kVocab, kT);
  // Each row holds one document from position 0; its targets are the next tokens, then EOT where
  // one follows the document in the file.
  std::map<int32_t, std::vector<int32_t>> targets;  // by the document's second token
  for (int r = 0; r < b.B; r++) {
    std::vector<int32_t> t;
    for (int j = 0; j < kT && b.targets[size_t(r * kT + j)] >= 0; j++)
      t.push_back(b.targets[size_t(r * kT + j)]);
    targets[b.tokens[size_t(r * kT + 1)]] = t;
  }
  EXPECT_EQ(targets[5], (std::vector<int32_t>{5, 6, 7, int32_t(e)}));
  EXPECT_EQ(targets[8], (std::vector<int32_t>{8, 9, int32_t(e)}));
  EXPECT_EQ(targets[10], (std::vector<int32_t>{10, 11, 12}));  // nothing follows the last
  // The EOT target is the next document's first token as the mask sees it: a 0 there drops it.
  ds.loss_mask.assign(ds.tokens.size(), 1);
  ds.loss_mask[4] = 0;
  PackedBatch masked;
  fill_packed_rows(ds, plan, rows, kT, &masked);
  EXPECT_EQ(masked.n_targets(), b.n_targets() - 1);
  ds.loss_mask.clear();
  // A long document cut into pieces: only its last piece's last token predicts the EOT.
  ds.tokens.assign(1, e);
  for (uint32_t i = 0; i < 30; ++i) ds.tokens.push_back(1 + i % 20);  // 31 tokens: 24 + 7
  ds.tokens.push_back(e);
  ds.tokens.push_back(2);
  ds.doc_offsets = {0, 31, 33};
  const PackPlan cut = pack_documents(document_lengths(ds), o);
  rows.assign(size_t(cut.n_rows()), 0);
  for (size_t i = 0; i < rows.size(); i++) rows[i] = int64_t(i);
  fill_packed_rows(ds, cut, rows, kT, &b);
  int eot_targets = 0;
  for (int32_t t : b.targets) eot_targets += t == int32_t(e);
  EXPECT_EQ(eot_targets, 1);
  EXPECT_EQ(b.n_targets(), 30 + 1 + 1);  // the long document's 30 and its EOT, and [EOT, 2]'s 1
  // A document that ends with its own EOT (text imports) predicts nothing after it, not even an
  // EOT that a next (empty) document holds.
  ds.tokens = {5, 6, e, e, 8, e};
  ds.doc_offsets = {0, 3, 4, 6};
  const PackPlan text = pack_documents(document_lengths(ds), o);
  rows.assign(size_t(text.n_rows()), 0);
  for (size_t i = 0; i < rows.size(); i++) rows[i] = int64_t(i);
  fill_packed_rows(ds, text, rows, kT, &b);
  EXPECT_EQ(b.n_targets(), 2 + 0 + 1);
}

}  // namespace
}  // namespace berth
