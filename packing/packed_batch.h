// PackedBatch: one micro-batch of B rows × T tokens as the model consumes it (host memory).
//
//   tokens     (N = B*T)  input token ids, each in [0, vocab)
//   targets    (N)        next-token ids, or -1 = no prediction here (document end, padding, masked)
//   positions  (N)        position of each token inside its sequence (restarts at 0 per sequence)
//   cu_seqlens (S+1)      int32 sequence starts over the N tokens (flash-attention varlen layout):
//                         sequence s is tokens [cu_seqlens[s], cu_seqlens[s+1]); every row start
//                         (multiple of T) is a boundary, so no sequence crosses rows
//   max_seqlen            the longest sequence
//
// The stream loader (one sequence per row) fills it today; the packers of the packing issue fill
// several documents per row into the same structure, and the model code does not change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth {

struct PackedBatch {
  int B = 0;
  int T = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  std::vector<int32_t> positions;
  std::vector<int32_t> cu_seqlens;
  int32_t max_seqlen = 0;
  // Slots that hold padding, not a token of a document (packed and padded rows; set by
  // fill_packed_rows, 0 otherwise): N() - n_padding tokens of data are trained on.
  int64_t n_padding = 0;

  int N() const { return B * T; }
  int n_seqs() const { return cu_seqlens.empty() ? 0 : int(cu_seqlens.size()) - 1; }
  // Number of tokens that carry a prediction (targets != -1).
  int64_t n_targets() const;
};

// Sizes the vectors for B×T with one sequence per row (positions 0..T-1, cu_seqlens at rows).
void reset_rows(PackedBatch* batch, int B, int T);

// Throws berth::Error describing the first violated invariant (sizes, cu_seqlens monotone from 0
// to N including every row start, positions restarting at 0 and increasing by 1 inside a
// sequence, positions < max_positions, tokens in [0, vocab), targets in [-1, vocab)).
void check_invariants(const PackedBatch& batch, int64_t vocab, int64_t max_positions);

}  // namespace berth
