// Context-parallel sharding of a packed batch (zigzag), pure: every sequence of the batch is
// padded to a multiple of 2·cp tokens and cut into 2·cp equal chunks; CP rank r keeps chunks r and
// 2·cp − 1 − r. Under causal attention chunk k costs ∝ k, so every rank gets the same work
// (r + (2·cp − 1 − r) = 2·cp − 1 chunk-units per sequence). Tokens, targets (the loss mask: −1)
// and positions are sliced the same way; positions stay global, so ring attention can mask by
// them. Padding sits at the end of a sequence (targets −1, positions past its length), where
// causal masking keeps real queries from seeing it.
#pragma once

#include <cstdint>
#include <vector>

#include "packing/packed_batch.h"

namespace berth {

struct CpShard {
  int cp = 1, rank = 0;
  std::vector<int32_t> tokens, targets, positions;  // this rank's tokens, sequence by sequence
  // Local pieces: sequence s's tokens here are [cu_seqlens[s], cu_seqlens[s+1]): its chunk r,
  // then its chunk 2·cp − 1 − r, each chunk_len[s] long.
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> chunk_len;   // per sequence: padded length / (2·cp)
  std::vector<int32_t> seq_len;     // per sequence: length before padding
  int n() const { return int(tokens.size()); }
};

// Throws Error for cp < 1 or rank outside 0..cp-1.
CpShard cp_shard(const PackedBatch& batch, int cp, int rank);

// Writes this rank's shard of `batch` into `local` as a batch the model consumes: B rows of
// T/cp tokens, global positions, cu_seqlens at the local pieces. Requires every sequence to be a
// multiple of 2·cp long (then nothing is padded and each row splits exactly): stream rows with T
// divisible by 2·cp, or packed rows built with PackOptions::align = 2·cp.
void cp_local_batch(const PackedBatch& batch, int cp, int rank, PackedBatch* local);

// The padded length of a sequence of `length` tokens: the next multiple of 2·cp.
int32_t cp_padded_length(int32_t length, int cp);

}  // namespace berth
