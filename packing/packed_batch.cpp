#include "packing/packed_batch.h"

#include <algorithm>

#include "runtime/core/check.h"

namespace berth {

int64_t PackedBatch::n_targets() const {
  int64_t n = 0;
  for (int32_t t : targets) n += t >= 0;
  return n;
}

void reset_rows(PackedBatch* batch, int B, int T) {
  BERTH_CHECK(B > 0 && T > 0, "batch shape must be positive, got B={} T={}", B, T);
  batch->B = B;
  batch->T = T;
  const size_t N = size_t(B) * size_t(T);
  batch->tokens.assign(N, 0);
  batch->targets.assign(N, -1);
  batch->positions.resize(N);
  for (size_t i = 0; i < N; i++) batch->positions[i] = int32_t(i % size_t(T));
  batch->cu_seqlens.resize(size_t(B) + 1);
  for (int r = 0; r <= B; r++) batch->cu_seqlens[size_t(r)] = r * T;
  batch->max_seqlen = T;
  batch->n_padding = 0;
}

void check_invariants(const PackedBatch& b, int64_t vocab, int64_t max_positions) {
  const int N = b.N();
  BERTH_CHECK(b.B > 0 && b.T > 0, "PackedBatch: B={} T={} must be positive", b.B, b.T);
  BERTH_CHECK(int(b.tokens.size()) == N && int(b.targets.size()) == N &&
                  int(b.positions.size()) == N,
              "PackedBatch: tokens/targets/positions sizes {}/{}/{} != B*T = {}", b.tokens.size(),
              b.targets.size(), b.positions.size(), N);
  BERTH_CHECK(b.cu_seqlens.size() >= 2 && b.cu_seqlens.front() == 0 && b.cu_seqlens.back() == N,
              "PackedBatch: cu_seqlens must run from 0 to N = {}", N);
  for (size_t k = 1; k < b.cu_seqlens.size(); k++) {
    BERTH_CHECK(b.cu_seqlens[k] >= b.cu_seqlens[k - 1] && b.cu_seqlens[k] <= N,
                "PackedBatch: cu_seqlens[{}] = {} is not in [cu_seqlens[{}] = {}, N = {}]", k,
                b.cu_seqlens[k], k - 1, b.cu_seqlens[k - 1], N);
  }
  int32_t longest = 0;
  size_t s = 0;
  for (int i = 0; i < N; i++) {
    while (s + 1 < b.cu_seqlens.size() && b.cu_seqlens[s + 1] <= i) s++;
    const bool seq_start = b.cu_seqlens[s] == i;
    if (i % b.T == 0) {
      BERTH_CHECK(seq_start, "PackedBatch: row start {} is not a sequence boundary", i);
    }
    const int32_t expect = seq_start ? 0 : b.positions[size_t(i) - 1] + 1;
    BERTH_CHECK(b.positions[size_t(i)] == expect, "PackedBatch: position {} at token {}, expected {}",
                b.positions[size_t(i)], i, expect);
    BERTH_CHECK(b.positions[size_t(i)] < max_positions,
                "PackedBatch: position {} at token {} >= max positions {}", b.positions[size_t(i)],
                i, max_positions);
    BERTH_CHECK(b.tokens[size_t(i)] >= 0 && b.tokens[size_t(i)] < vocab,
                "PackedBatch: token {} at {} outside [0, {})", b.tokens[size_t(i)], i, vocab);
    BERTH_CHECK(b.targets[size_t(i)] >= -1 && b.targets[size_t(i)] < vocab,
                "PackedBatch: target {} at {} outside [-1, {})", b.targets[size_t(i)], i, vocab);
    longest = std::max(longest, b.positions[size_t(i)] + 1);
  }
  BERTH_CHECK(b.max_seqlen >= longest, "PackedBatch: max_seqlen {} < longest sequence {}",
              b.max_seqlen, longest);
}

}  // namespace berth
