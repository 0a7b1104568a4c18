// Zigzag context-parallel sharding, without MPI: for cp in 1..4 the shards of all ranks put back
// together give every sequence of the batch (padding last, no target), every rank holds the same
// number of tokens and the same causal work, including sequences shorter than 2·cp and rows
// holding several sequences whose boundaries fall inside chunks.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "packing/cp_shard.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

// Rows of T = 64 holding sequences of the given lengths (each row's lengths sum to 64).
PackedBatch batch_of(const std::vector<std::vector<int>>& rows) {
  PackedBatch b;
  b.B = int(rows.size());
  b.T = 64;
  b.cu_seqlens.push_back(0);
  int32_t tok = 1;
  for (const auto& row : rows) {
    for (int len : row) {
      for (int i = 0; i < len; ++i) {
        b.tokens.push_back(tok++);
        b.targets.push_back(i + 1 < len ? tok : -1);
        b.positions.push_back(i);
      }
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
      b.max_seqlen = std::max(b.max_seqlen, int32_t(len));
    }
  }
  return b;
}

TEST(CpShard, ZigzagShardsReassembleAndBalance) {
  const PackedBatch b = batch_of({{17, 31, 16}, {3, 61}, {64}, {1, 2, 61}});
  for (int cp = 1; cp <= 4; ++cp) {
    std::vector<CpShard> shards;
    for (int r = 0; r < cp; ++r) shards.push_back(cp_shard(b, cp, r));
    for (int s = 0; s < b.n_seqs(); ++s) {
      const int32_t begin = b.cu_seqlens[size_t(s)], len = b.cu_seqlens[size_t(s) + 1] - begin;
      const int32_t c = shards[0].chunk_len[size_t(s)];
      ASSERT_EQ(2 * cp * c, cp_padded_length(len, cp));
      ASSERT_EQ(shards[0].seq_len[size_t(s)], len);
      for (int32_t k = 0; k < 2 * cp; ++k) {  // chunk k lives on rank min(k, 2cp − 1 − k)
        const int r = k < cp ? k : 2 * cp - 1 - k;
        const CpShard& sh = shards[size_t(r)];
        const int32_t at = sh.cu_seqlens[size_t(s)] + (k == r ? 0 : c);
        for (int32_t i = 0; i < c; ++i) {
          const int32_t g = k * c + i;  // position in the padded sequence
          EXPECT_EQ(sh.positions[size_t(at + i)], g) << "cp " << cp << " seq " << s;
          if (g < len) {
            EXPECT_EQ(sh.tokens[size_t(at + i)], b.tokens[size_t(begin + g)]);
            EXPECT_EQ(sh.targets[size_t(at + i)], b.targets[size_t(begin + g)]);
          } else {
            EXPECT_EQ(sh.targets[size_t(at + i)], -1) << "padding carries no target";
          }
        }
      }
    }
    // Same tokens and the same causal work (Σ (position + 1) over queries) on every rank.
    for (int r = 1; r < cp; ++r) {
      EXPECT_EQ(shards[size_t(r)].n(), shards[0].n()) << "cp " << cp;
      auto work = [](const CpShard& sh) {
        int64_t w = 0;
        for (int32_t p : sh.positions) w += p + 1;
        return w;
      };
      EXPECT_EQ(work(shards[size_t(r)]), work(shards[0])) << "cp " << cp << " rank " << r;
    }
  }
}

TEST(CpShard, ShortSequencesArePaddedToOneTokenPerChunk) {
  const PackedBatch b = batch_of({{3, 61}});
  const CpShard sh = cp_shard(b, 4, 1);  // 3 tokens → 8: chunks 1 and 6 of one token each
  EXPECT_EQ(sh.chunk_len[0], 1);
  EXPECT_EQ(sh.cu_seqlens[1], 2);
  EXPECT_EQ(sh.positions[0], 1);
  EXPECT_EQ(sh.positions[1], 6);
  EXPECT_EQ(sh.targets[1], -1);
  EXPECT_EQ(cp_padded_length(61, 4), 64);
  EXPECT_THROW(cp_shard(b, 0, 0), Error);
  EXPECT_THROW(cp_shard(b, 2, 2), Error);
}

TEST(CpShard, LocalBatchesOfAlignedPackedRowsSplitExactly) {
  // Rows packed with align 2·cp: every sequence (and the row's tail padding) is a multiple of
  // 2·cp long, so each rank gets exactly T/cp tokens per row and the shards reassemble the rows.
  for (int cp : {2, 4}) {
    const int a = 2 * cp;
    const PackedBatch b = batch_of({{3 * a, 5 * a, 64 - 8 * a}, {a, 64 - a}, {64}});
    std::vector<int> seen(b.tokens.size() + 2, 0);
    for (int r = 0; r < cp; ++r) {
      PackedBatch local;
      cp_local_batch(b, cp, r, &local);
      ASSERT_EQ(local.T, 64 / cp);
      ASSERT_EQ(local.B, 3);
      ASSERT_EQ(int(local.tokens.size()), 3 * 64 / cp) << "no padding added";
      for (int32_t t : local.tokens) seen[size_t(t)]++;
    }
    for (size_t t = 1; t <= b.tokens.size(); ++t) EXPECT_EQ(seen[t], 1) << "token " << t;
  }
  // A sequence that is not a multiple of 2·cp is refused with what to do.
  PackedBatch unaligned = batch_of({{10, 54}});
  PackedBatch local;
  try {
    cp_local_batch(unaligned, 2, 0, &local);
    ADD_FAILURE() << "accepted a 10-token sequence at cp 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows packed with align 2·cp"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace berth
