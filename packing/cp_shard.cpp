#include "packing/cp_shard.h"

#include "runtime/core/check.h"

namespace berth {

int32_t cp_padded_length(int32_t length, int cp) {
  const int32_t m = 2 * cp;
  return (length + m - 1) / m * m;
}

CpShard cp_shard(const PackedBatch& b, int cp, int rank) {
  BERTH_CHECK(cp >= 1 && rank >= 0 && rank < cp, "cp_shard: rank {} of cp = {}", rank, cp);
  CpShard out;
  out.cp = cp;
  out.rank = rank;
  out.cu_seqlens.push_back(0);
  const int S = b.n_seqs();
  for (int s = 0; s < S; ++s) {
    const int32_t begin = b.cu_seqlens[size_t(s)], len = b.cu_seqlens[size_t(s) + 1] - begin;
    const int32_t c = cp_padded_length(len, cp) / (2 * cp);
    out.chunk_len.push_back(c);
    out.seq_len.push_back(len);
    for (int32_t chunk : {rank, 2 * cp - 1 - rank}) {
      for (int32_t i = chunk * c; i < (chunk + 1) * c; ++i) {
        if (i < len) {
          out.tokens.push_back(b.tokens[size_t(begin + i)]);
          out.targets.push_back(b.targets[size_t(begin + i)]);
          out.positions.push_back(b.positions[size_t(begin + i)]);
        } else {  // padding: any valid token, no target, the position it would have
          out.tokens.push_back(0);
          out.targets.push_back(-1);
          out.positions.push_back(b.positions[size_t(begin)] + i);
        }
      }
    }
    out.cu_seqlens.push_back(int32_t(out.tokens.size()));
  }
  return out;
}

void cp_local_batch(const PackedBatch& batch, int cp, int rank, PackedBatch* local) {
  bool aligned = batch.T % (2 * cp) == 0;
  for (int s = 0; s < batch.n_seqs() && aligned; ++s) {
    aligned = (batch.cu_seqlens[size_t(s) + 1] - batch.cu_seqlens[size_t(s)]) % (2 * cp) == 0;
  }
  BERTH_CHECK(aligned,
              "context parallelism needs every sequence of a row to be a multiple of 2·cp = {} "
              "tokens long (stream rows of such a length, or rows packed with align 2·cp); got "
              "{} sequences in {} rows of {}",
              2 * cp, batch.n_seqs(), batch.B, batch.T);
  CpShard sh = cp_shard(batch, cp, rank);
  local->B = batch.B;
  local->T = batch.T / cp;
  local->tokens = std::move(sh.tokens);
  local->targets = std::move(sh.targets);
  local->positions = std::move(sh.positions);
  local->cu_seqlens = std::move(sh.cu_seqlens);
  local->max_seqlen = local->T;
}

}  // namespace berth
