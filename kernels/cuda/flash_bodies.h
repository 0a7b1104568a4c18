// The bf16 tensor-core attention of the CUDA backend (run.precision = "bf16"), flash-style
// (FlashAttention-2's loop order): tiles in shared memory, an online softmax, 16×16×16 bf16
// products with fp32 accumulation (tiles.h), the log-sum-exp kept for the backward, never an
// L×L matrix. Head sizes: tiled_attention_head_size (runtime/core/backend.h). Two token sources,
// one kernel each way:
//   - Varlen: the model's causal attention over one (N, 3C) qkv cut by cu_seqlens;
//   - Block: ring attention's query block against a key/value block, tokens placed by sequence
//     id and global position (kernels/ops.h attention_block_*).
//
// Numerics (what the tests hold it to, tests/test_backend.cpp): Q, K, V and dO are rounded to
// bf16 as they are loaded; the scores, the softmax, its running max and sum, the output
// accumulator, dP and dS are fp32; the probabilities P and dS are rounded to bf16 as operands of
// the next product, as FlashAttention does. Outputs (O, LSE, dQ, dK, dV) are fp32.
//
// The mask: every token has a place (sequence id, position); query i sees key j when their
// sequences match and pos(j) <= pos(i). A query tile of 64 consecutive tokens may hold several
// documents. Varlen places are (document, token index), in order, so key tiles run only from the
// first row's document start to the last row, and a warp skips a tile none of its rows sees.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/thread_bodies.h"
#include "kernels/cuda/tiles.h"

namespace berth::cuda::flash {
inline namespace BERTH_TILES_EXECUTOR {  // see tiles.h

using tiles::bf16;
using tiles::Lanes;
using tiles::mma_tile;
using tiles::Team;
using tiles::to_bf16;

constexpr int kTile = 64;  // queries per block (forward) and keys per block (backward)
constexpr int kWarps = 4;  // each owns 16 rows of the block's tile
constexpr int kThreads = kWarps * tiles::kWarpSize;
constexpr int kLdS = kTile + 4;  // fp32 pitch of a 64-wide score tile (pads shared-memory banks)
constexpr int kLdP = kTile + 8;  // bf16 pitch of a 64-wide probability tile

// A block's 64-row tile of one head: rows [first, first + count) of the N, head h.
struct Tile {
  int h, first, count;
};
BERTH_TILES_HD Tile tile_of(int block, int N, int NH) {
  const int first = (block / NH) * kTile;
  return {block % NH, first, N - first < kTile ? N - first : kTile};
}
inline int64_t tile_blocks(int N, int NH) { return int64_t((N + kTile - 1) / kTile) * NH; }

// Tile rows [row0, row0 + count) of one head of a (N, 3C) qkv (part 0 q, 1 k, 2 v) or (N, C)
// tensor `src` with row stride `stride`, rounded to bf16, into dst (pitch ld); rows at or past
// `end` are zero. Threads of the team share the work.
template <int HS, int kRows = kTile>
BERTH_DEV void load_rows(bf16* dst, int ld, const float* src, int64_t stride, int row0, int end,
                         const Team& t) {
  for (int e = t.tid; e < kRows * HS; e += t.n) {
    const int r = e / HS, x = e % HS, row = row0 + r;
    dst[r * ld + x] = to_bf16(row < end ? src[int64_t(row) * stride + x] : 0.0f);
  }
}

// ---- token sources ------------------------------------------------------------------------------
// Out-of-range tokens are placed where nothing matches: keys in sequence −1, queries in −2 (real
// sequence ids are >= 0, kernels/ops.h).
constexpr int32_t kNoKey = -1, kNoQuery = -2;

// The model's attention: queries and keys are the same N tokens of one (N, 3C) qkv.
struct Varlen {
  static constexpr bool kSorted = true;  // places ascend with the token index
  const float* qkv;
  const int32_t* cu;  // S + 1
  int S, N, C;
  BERTH_TILES_HD const float* q() const { return qkv; }
  BERTH_TILES_HD const float* k() const { return qkv + C; }
  BERTH_TILES_HD const float* v() const { return qkv + 2 * C; }
  BERTH_TILES_HD int64_t stride() const { return 3 * int64_t(C); }
  BERTH_TILES_HD int width() const { return C; }
  BERTH_TILES_HD int nq() const { return N; }
  BERTH_TILES_HD int nk() const { return N; }
  BERTH_TILES_HD void place(int token, int32_t* seq, int32_t* pos) const {
    *seq = body::sequence_of(token, cu, S), *pos = token;
  }
  BERTH_TILES_HD void query_place(int i, int32_t* seq, int32_t* pos) const { place(i, seq, pos); }
  BERTH_TILES_HD void key_place(int j, int32_t* seq, int32_t* pos) const { place(j, seq, pos); }
  // The keys queries [first, last] may see: from the first one's document start to the last.
  BERTH_TILES_HD int key_begin(int first) const { return cu[body::sequence_of(first, cu, S)]; }
  BERTH_TILES_HD int key_end(int last) const { return last + 1; }
  // The queries that may see keys [first, last]: from the first to the last one's document end.
  BERTH_TILES_HD int query_begin(int first) const { return first; }
  BERTH_TILES_HD int query_end(int last) const { return cu[body::sequence_of(last, cu, S) + 1]; }
};

// Ring attention: q (nq, C) against k and v (nk, C), each token placed by the given arrays.
struct Block {
  static constexpr bool kSorted = false;
  const float *q_, *k_, *v_;
  const int32_t *q_seq, *q_pos, *k_seq, *k_pos;
  int nq_, nk_, C;
  BERTH_TILES_HD const float* q() const { return q_; }
  BERTH_TILES_HD const float* k() const { return k_; }
  BERTH_TILES_HD const float* v() const { return v_; }
  BERTH_TILES_HD int64_t stride() const { return C; }
  BERTH_TILES_HD int width() const { return C; }
  BERTH_TILES_HD int nq() const { return nq_; }
  BERTH_TILES_HD int nk() const { return nk_; }
  BERTH_TILES_HD void query_place(int i, int32_t* seq, int32_t* pos) const {
    *seq = q_seq[i], *pos = q_pos[i];
  }
  BERTH_TILES_HD void key_place(int j, int32_t* seq, int32_t* pos) const {
    *seq = k_seq[j], *pos = k_pos[j];
  }
  BERTH_TILES_HD int key_begin(int) const { return 0; }
  BERTH_TILES_HD int key_end(int) const { return nk_; }
  BERTH_TILES_HD int query_begin(int) const { return 0; }
  BERTH_TILES_HD int query_end(int) const { return nq_; }
};

// (seq a, pos a) comes before (seq b, pos b)
BERTH_TILES_HD bool before(int32_t sa, int32_t pa, int32_t sb, int32_t pb) {
  return sa < sb || (sa == sb && pa < pb);
}

// Places of `count` tokens from `first` (the rest of the kRows get `none`), for the mask.
template <int kRows = kTile, class Place>
BERTH_DEV void load_places(int32_t* seq, int32_t* pos, int first, int count, int32_t none,
                           const Team& t, Place place) {
  for (int r = t.tid; r < kRows; r += t.n) {
    if (r < count) {
      place(first + r, seq + r, pos + r);
    } else {
      seq[r] = none, pos[r] = 0;
    }
  }
}

// Whether sees(i, j) holds for any of 16 rows i and kCols columns j: the warp's lanes share the
// pairs and vote (__any_sync), so every lane gets the same answer. For sources whose places are
// not in order, where a tile cannot be skipped from its ends. Every lane must call it.
template <int kCols = kTile, class Sees>
BERTH_DEV bool warp_any(const Lanes& ln, Sees sees) {
  bool mine = false;
  for (int e = ln.lane; e < 16 * kCols && !mine; e += ln.n) mine = sees(e / kCols, e % kCols);
  return tiles::any_lane(ln, mine);
}

// ---- forward: a block per (query tile, head) ----------------------------------------------------
// out (nq, C) and lse (nq, NH) overwritten; a query that sees no key gets 0 and −inf.
template <int HS, class Src>
struct Forward {
  float* out;
  float* lse;
  Src src;
  int NH;

  static constexpr int kLd = HS + 8;  // bf16 pitch of Q, K, V tiles
  static constexpr int kLdO = HS + 4;
  // The block's shared memory, region by region; listed once for its size and its pointers.
  struct Shared {
    bf16 *q, *k, *v, *p;
    float *s, *o, *m, *l;
    float *part_max, *part_sum, *corr, *m_new;  // the softmax's halves of a row, and its update
    int32_t *qseq, *qpos, *kseq, *kpos;
  };
  static constexpr BERTH_TILES_HD Shared carve(tiles::SharedCarver& c) {
    Shared sm{};
    sm.q = c.take<bf16>(kTile * kLd), sm.k = c.take<bf16>(kTile * kLd);
    sm.v = c.take<bf16>(kTile * kLd), sm.s = c.take<float>(kTile * kLdS);
    sm.p = c.take<bf16>(kTile * kLdP), sm.o = c.take<float>(kTile * kLdO);
    sm.m = c.take<float>(kTile), sm.l = c.take<float>(kTile);
    sm.part_max = c.take<float>(2 * kTile), sm.part_sum = c.take<float>(2 * kTile);
    sm.corr = c.take<float>(kTile), sm.m_new = c.take<float>(kTile);
    sm.qseq = c.take<int32_t>(kTile), sm.qpos = c.take<int32_t>(kTile);
    sm.kseq = c.take<int32_t>(kTile), sm.kpos = c.take<int32_t>(kTile);
    return sm;
  }
  static constexpr size_t shared_bytes() { return tiles::SharedCarver::bytes_of(carve); }
  int64_t blocks() const { return tile_blocks(src.nq(), NH); }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    tiles::SharedCarver carver{smem};
    const Shared sm = carve(carver);
    const Tile t = tile_of(block, src.nq(), NH);
    const int h = t.h, row0 = t.first, rows = t.count, C = src.width();
    const float scale = 1.0f / sqrtf(float(HS));
    const Src& sc = src;

    load_rows<HS>(sm.q, kLd, src.q() + h * HS, src.stride(), row0, row0 + rows, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) sm.o[(e / HS) * kLdO + e % HS] = 0.0f;
    for (int r = team.tid; r < kTile; r += team.n) sm.m[r] = body::neg_inf(), sm.l[r] = 0.0f;
    load_places(sm.qseq, sm.qpos, row0, rows, kNoQuery, team,
                [&](int i, int32_t* a, int32_t* b) { sc.query_place(i, a, b); });
    team.sync();
    const int key_end = src.key_end(row0 + rows - 1);
    for (int k0 = src.key_begin(row0); k0 < key_end; k0 += kTile) {
      const int keys = key_end - k0 < kTile ? key_end - k0 : kTile;
      load_rows<HS>(sm.k, kLd, src.k() + h * HS, src.stride(), k0, key_end, team);
      load_rows<HS>(sm.v, kLd, src.v() + h * HS, src.stride(), k0, key_end, team);
      load_places(sm.kseq, sm.kpos, k0, keys, kNoKey, team,
                  [&](int j, int32_t* a, int32_t* b) { sc.key_place(j, a, b); });
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16, rl = r0 + 15 < rows ? r0 + 15 : rows - 1;
        if (r0 >= rows) return;  // warp-uniform skips: no row, or no row sees a key of the tile:
        if (Src::kSorted) {      // with places in order, every key after every row or in an
          if (before(sm.qseq[rl], sm.qpos[rl], sm.kseq[0], sm.kpos[0]) ||  // earlier document
              sm.kseq[keys - 1] < sm.qseq[r0])
            return;
        } else if (!warp_any(ln, [&](int i, int j) {
                     return sm.kseq[j] == sm.qseq[r0 + i] && sm.kpos[j] <= sm.qpos[r0 + i];
                   })) {
          return;
        }
        for (int n = 0; n < kTile; n += 16)  // S = Q·Kᵀ (16 × 64)
          mma_tile<false, true>(sm.s + r0 * kLdS + n, kLdS, false, sm.q + r0 * kLd, kLd,
                                sm.k + n * kLd, kLd, HS);
        ln.sync();
        // Online softmax, two lanes a row (e: row r0 + e/2, half e%2 of its 64 keys and of O's
        // columns), in three steps the halves meet between: the masked, scaled scores and their
        // maximum; the new maximum, P and its sum; O and the running max and sum rescaled.
        constexpr int kHalf = kTile / 2, kHalfO = HS / 2;
        for (int e = ln.lane; e < 32; e += ln.n) {
          const int r = r0 + e / 2, j0 = (e % 2) * kHalf;
          float* sr = sm.s + r * kLdS;
          float mx = body::neg_inf();
          for (int j = j0; j < j0 + kHalf; j++) {
            const bool sees = sm.kseq[j] == sm.qseq[r] && sm.kpos[j] <= sm.qpos[r];
            sr[j] = sees ? sr[j] * scale : body::neg_inf();
            mx = sr[j] > mx ? sr[j] : mx;
          }
          sm.part_max[2 * r + e % 2] = mx;
        }
        ln.sync();
        for (int e = ln.lane; e < 32; e += ln.n) {
          const int r = r0 + e / 2, j0 = (e % 2) * kHalf;
          const float mx = fmaxf(sm.part_max[2 * r], sm.part_max[2 * r + 1]);
          const bool none = mx == body::neg_inf();  // sees nothing here: P = 0, state stays
          const float m_new = none ? sm.m[r] : fmaxf(sm.m[r], mx);
          float sum = 0.0f;
          for (int j = j0; j < j0 + kHalf; j++) {
            const float pj = none ? 0.0f : expf(sm.s[r * kLdS + j] - m_new);  // 0 if unseen
            sm.p[r * kLdP + j] = to_bf16(pj);
            sum += pj;
          }
          sm.part_sum[2 * r + e % 2] = sum;
          if (e % 2 == 0) sm.m_new[r] = m_new, sm.corr[r] = none ? 1.0f : expf(sm.m[r] - m_new);
        }
        ln.sync();
        for (int e = ln.lane; e < 32; e += ln.n) {
          const int r = r0 + e / 2, x0 = (e % 2) * kHalfO;
          const float corr = sm.corr[r];
          if (corr != 1.0f)
            for (int x = x0; x < x0 + kHalfO; x++) sm.o[r * kLdO + x] *= corr;
          if (e % 2 == 0) {
            sm.l[r] = sm.l[r] * corr + sm.part_sum[2 * r] + sm.part_sum[2 * r + 1];
            sm.m[r] = sm.m_new[r];
          }
        }
        ln.sync();
        for (int c = 0; c < HS; c += 16)  // O += P·V (16 × HS)
          mma_tile<false, false>(sm.o + r0 * kLdO + c, kLdO, true, sm.p + r0 * kLdP, kLdP, sm.v + c,
                                 kLd, kTile);
      });
      team.sync();
    }
    tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
      for (int e = ln.lane; e < 16 * HS; e += ln.n) {
        const int r = w * 16 + e / HS, x = e % HS;
        if (r < rows) {
          const float lr = sm.l[r];
          out[int64_t(row0 + r) * C + h * HS + x] = lr > 0.0f ? sm.o[r * kLdO + x] / lr : 0.0f;
        }
      }
      for (int r = w * 16 + ln.lane; r < w * 16 + 16; r += ln.n) {
        if (r < rows)
          lse[int64_t(row0 + r) * NH + h] =
              sm.l[r] > 0.0f ? sm.m[r] + logf(sm.l[r]) : body::neg_inf();
      }
    });
  }
};

// ---- backward: a block per (key tile, head); dQ by atomics --------------------------------------
// delta (nq, NH) = Σ_x dO·O per (query, head), computed before (body::attention_row_dot). dq
// (nq rows), dk and dv (nk rows) are added to (+=), each `dstride` floats a row, head h at
// column h·HS: each block adds its keys' dK and dV rows and atomically its share of dQ.
template <int HS, class Src, int kQ = kTile>
struct Backward {
  float *dq, *dk, *dv;
  int64_t dstride;
  const float* dout;   // (nq, C)
  const float* lse;    // (nq, NH)
  const float* delta;  // (nq, NH)
  Src src;
  int NH;

  static constexpr int kLd = HS + 8;
  static constexpr int kLdO = HS + 4;
  static constexpr int kLdSq = kQ + 4;  // fp32 pitch of a 64-key × kQ-query score tile
  static constexpr int kLdPq = kQ + 8;  // bf16 pitch of its probabilities
  struct Shared {  // as Forward's
    bf16 *k, *v, *q, *d, *p, *ds;
    float *s, *dp, *dk, *dv, *dqt, *lse_t, *delta_t;
    int32_t *qseq, *qpos, *kseq, *kpos;
  };
  static constexpr BERTH_TILES_HD Shared carve(tiles::SharedCarver& c) {
    Shared sm{};
    sm.k = c.take<bf16>(kTile * kLd), sm.v = c.take<bf16>(kTile * kLd);
    sm.q = c.take<bf16>(kQ * kLd), sm.d = c.take<bf16>(kQ * kLd);
    sm.s = c.take<float>(kTile * kLdSq), sm.dp = c.take<float>(kTile * kLdSq);
    sm.p = c.take<bf16>(kTile * kLdPq), sm.ds = c.take<bf16>(kTile * kLdPq);
    sm.dk = c.take<float>(kTile * kLdO), sm.dv = c.take<float>(kTile * kLdO);
    sm.dqt = c.take<float>(kWarps * 16 * 16), sm.lse_t = c.take<float>(kQ);
    sm.delta_t = c.take<float>(kQ);
    sm.qseq = c.take<int32_t>(kQ), sm.qpos = c.take<int32_t>(kQ);
    sm.kseq = c.take<int32_t>(kTile), sm.kpos = c.take<int32_t>(kTile);
    return sm;
  }
  static constexpr size_t shared_bytes() { return tiles::SharedCarver::bytes_of(carve); }
  int64_t blocks() const { return tile_blocks(src.nk(), NH); }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    tiles::SharedCarver carver{smem};
    const Shared sm = carve(carver);
    const Tile t = tile_of(block, src.nk(), NH);
    const int h = t.h, key0 = t.first, keys = t.count, C = src.width();
    const float scale = 1.0f / sqrtf(float(HS));
    const Src& sc = src;

    load_rows<HS>(sm.k, kLd, src.k() + h * HS, src.stride(), key0, key0 + keys, team);
    load_rows<HS>(sm.v, kLd, src.v() + h * HS, src.stride(), key0, key0 + keys, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) {
      sm.dk[(e / HS) * kLdO + e % HS] = 0.0f, sm.dv[(e / HS) * kLdO + e % HS] = 0.0f;
    }
    load_places(sm.kseq, sm.kpos, key0, keys, kNoKey, team,
                [&](int j, int32_t* a, int32_t* b) { sc.key_place(j, a, b); });
    team.sync();
    const int query_end = src.query_end(key0 + keys - 1);
    for (int q0 = src.query_begin(key0); q0 < query_end; q0 += kQ) {
      const int queries = query_end - q0 < kQ ? query_end - q0 : kQ;
      load_rows<HS, kQ>(sm.q, kLd, src.q() + h * HS, src.stride(), q0, query_end, team);
      load_rows<HS, kQ>(sm.d, kLd, dout + h * HS, C, q0, query_end, team);
      for (int i = team.tid; i < kQ; i += team.n) {
        const bool in = i < queries;
        sm.lse_t[i] = in ? lse[int64_t(q0 + i) * NH + h] : body::neg_inf();
        sm.delta_t[i] = in ? delta[int64_t(q0 + i) * NH + h] : 0.0f;
      }
      load_places<kQ>(sm.qseq, sm.qpos, q0, queries, kNoQuery, team,
                      [&](int i, int32_t* a, int32_t* b) { sc.query_place(i, a, b); });
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16, rl = r0 + 15 < keys ? r0 + 15 : keys - 1;  // this warp's keys
        // warp-uniform skips: no key, or no query of the tile sees one of them: with places in
        // order, every query before every key or in a later document than any. dS of its keys is
        // then 0 for the block's dQ product below.
        const bool none =
            r0 >= keys ||
            (Src::kSorted
                 ? before(sm.qseq[queries - 1], sm.qpos[queries - 1], sm.kseq[r0], sm.kpos[r0]) ||
                       sm.qseq[0] > sm.kseq[rl]
                 : !warp_any<kQ>(ln, [&](int i, int n) {
                     return sm.kseq[r0 + i] == sm.qseq[n] && sm.kpos[r0 + i] <= sm.qpos[n];
                   }));
        if (none) {
          for (int e = ln.lane; e < 16 * kQ; e += ln.n)
            sm.ds[(r0 + e / kQ) * kLdPq + e % kQ] = to_bf16(0.0f);
          return;
        }
        for (int n = 0; n < kQ; n += 16) {  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × kQ)
          mma_tile<false, true>(sm.s + r0 * kLdSq + n, kLdSq, false, sm.k + r0 * kLd, kLd,
                                sm.q + n * kLd, kLd, HS);
          mma_tile<false, true>(sm.dp + r0 * kLdSq + n, kLdSq, false, sm.v + r0 * kLd, kLd,
                                sm.d + n * kLd, kLd, HS);
        }
        ln.sync();
        for (int e = ln.lane; e < 32; e += ln.n) {  // two lanes a key row, 32 queries each
          const int r = r0 + e / 2, n0 = (e % 2) * (kQ / 2);
          for (int n = n0; n < n0 + kQ / 2; n++) {  // a query that sees nothing has LSE −inf
            const bool sees = sm.kseq[r] == sm.qseq[n] && sm.kpos[r] <= sm.qpos[n] &&
                              sm.lse_t[n] != body::neg_inf();
            const float pv = sees ? expf(sm.s[r * kLdSq + n] * scale - sm.lse_t[n]) : 0.0f;
            sm.p[r * kLdPq + n] = to_bf16(pv);
            sm.ds[r * kLdPq + n] =
                to_bf16(sees ? pv * (sm.dp[r * kLdSq + n] - sm.delta_t[n]) * scale : 0.0f);
          }
        }
        ln.sync();
        for (int c = 0; c < HS; c += 16) {  // dV += Pᵀ·dO, dK += dSᵀ·Q (16 keys × HS)
          mma_tile<false, false>(sm.dv + r0 * kLdO + c, kLdO, true, sm.p + r0 * kLdPq, kLdPq,
                                 sm.d + c, kLd, kQ);
          mma_tile<false, false>(sm.dk + r0 * kLdO + c, kLdO, true, sm.ds + r0 * kLdPq, kLdPq,
                                 sm.q + c, kLd, kQ);
        }
      });
      team.sync();
      // dQ += dS·K over the block's 64 keys, warp w for queries 16w … 16w + 15: one atomic add
      // per value and block (FlashAttention-2's), not one per warp
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int qb = w * 16;
        if (qb >= queries) return;
        float* part = sm.dqt + w * 256;
        for (int c = 0; c < HS; c += 16) {
          mma_tile<true, false>(part, 16, false, sm.ds + qb, kLdPq, sm.k + c, kLd, kTile);
          ln.sync();
          for (int e = ln.lane; e < 256; e += ln.n) {
            const int i = qb + e / 16;
            if (i < queries)
              body::atomic_add(dq + int64_t(q0 + i) * dstride + h * HS + c + e % 16, part[e]);
          }
          ln.sync();
        }
      });
      team.sync();
    }
    tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
      for (int e = ln.lane; e < 16 * HS; e += ln.n) {
        const int r = w * 16 + e / HS, x = e % HS;
        if (r >= keys) continue;
        const int64_t at = int64_t(key0 + r) * dstride + h * HS + x;
        dk[at] += sm.dk[r * kLdO + x], dv[at] += sm.dv[r * kLdO + x];
      }
    });
  }
};

}  // namespace BERTH_TILES_EXECUTOR
}  // namespace berth::cuda::flash
