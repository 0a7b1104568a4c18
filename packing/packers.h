// Packing plans: which pieces of which documents go into which row (pure; no I/O).
//
// A document of L tokens becomes pieces of at most T = seq_len tokens (long documents are cut
// into consecutive T-token chunks, or dropped with LongDocs::DROP). A plan is a list of rows, each
// a list of pieces whose lengths sum to <= T; the rest of a row is padding.
//   BFD       best-fit-decreasing over windows of `window` pieces: pieces of a window are sorted
//             by length (longest first) and each goes into the open row with the least room that
//             still fits it (a new row when none does); rows close at the end of the window.
//   NEXT_FIT  pieces in order; a piece that does not fit closes the current row.
//   PADDED    one piece per row (the baseline).
//   BALANCED  BFD on cost α·L + β·L² (attention-aware) instead of length, with the row capacity
//             still T tokens: rows end up with similar compute, not only similar token counts.
// Documents are first put in a seeded random order (seed), so a plan is a pure function of
// (document lengths, options). Empty documents produce no piece.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth {

enum class PackAlgorithm { BFD, NEXT_FIT, PADDED, BALANCED };
enum class LongDocs { SPLIT, DROP };

PackAlgorithm parse_pack_algorithm(const std::string& name);  // "bfd", "next_fit", "padded", "balanced"
std::string pack_algorithm_name(PackAlgorithm a);

struct PackOptions {
  int64_t seq_len = 0;
  PackAlgorithm algorithm = PackAlgorithm::BFD;
  int64_t window = 1000;
  LongDocs long_docs = LongDocs::SPLIT;
  uint64_t seed = 0;
  double alpha = 1.0, beta = 0.0;  // BALANCED cost per piece: alpha·L + beta·L²
  // Every piece takes a multiple of `align` slots of its row: its tokens, then padding (no
  // targets) up to the multiple. Context parallelism packs with align = 2·cp, so every sequence
  // of a row splits into 2·cp equal chunks. seq_len must be a multiple of align.
  int64_t align = 1;
};

struct Piece {
  int64_t doc = 0;    // document index in the dataset
  int64_t start = 0;  // first token, relative to the document
  int64_t length = 0;
};

struct PackPlan {
  PackOptions options;
  std::vector<int64_t> row_offsets;  // rows + 1 entries into `pieces`
  std::vector<Piece> pieces;

  int64_t n_rows() const { return row_offsets.empty() ? 0 : int64_t(row_offsets.size()) - 1; }
};

// Builds the plan. Throws Error for seq_len <= 0 or window <= 0.
PackPlan pack_documents(const std::vector<int64_t>& doc_lengths, const PackOptions& options);

struct PackStats {
  int64_t rows = 0, documents = 0, pieces = 0, docs_cut = 0, docs_dropped = 0;
  int64_t real_tokens = 0, slots = 0;  // slots = rows·T
  double efficiency = 0;               // real_tokens / slots
  double padding_waste = 0;            // 1 − efficiency
  double mean_sum_sq = 0, max_sum_sq = 0;  // Σ L² of the pieces of a row
};
PackStats pack_stats(const PackPlan& plan, const std::vector<int64_t>& doc_lengths);

// Why `plan` is not a plan of documents of these lengths under its own options ("" when it is):
// every piece inside its document, every row within seq_len (pieces padded to `align`), and every
// document's tokens in exactly one piece each, in consecutive pieces from its first token to its
// last, except documents longer than seq_len under LongDocs::DROP, which have none. A plan whose
// key matches its dataset can still be edited or damaged; the loader trusts what this passed.
std::string plan_mismatch(const PackPlan& plan, const std::vector<int64_t>& doc_lengths);
std::string format_pack_stats(const PackStats& s, double seconds);

}  // namespace berth
