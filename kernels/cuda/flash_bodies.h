// The bf16 tensor-core attention of the CUDA backend (run.precision = "bf16"): causal attention
// over the cu_seqlens varlen layout, flash-style (FlashAttention-2's loop order): tiles in shared
// memory, an online softmax, 16×16×16 bf16 products with fp32 accumulation (tiles.h), the
// log-sum-exp kept for the backward, never an L×L matrix. Head sizes 32, 64 and 128.
//
// Numerics (what the tests hold it to, tests/test_backend.cpp): Q, K, V and dO are rounded to
// bf16 as they are loaded; the scores, the softmax, its running max and sum, the output
// accumulator, dP and dS are fp32; the probabilities P and dS are rounded to bf16 as operands of
// the next product, as FlashAttention does. Outputs (O, LSE, dQ, dK, dV) are fp32.
//
// Packed rows: a query tile is 64 consecutive tokens of the N, which may belong to several
// documents. Each row knows its document's first token; a key j is seen by query i when
// start(i) <= j <= i. Key tiles run from the first row's document start to the last row.
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

// Whether these kernels take a head size.
inline bool supports(int head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}

// Tile rows [row0, row0 + count) of one head of a (N, 3C) qkv (part 0 q, 1 k, 2 v) or (N, C)
// tensor `src` with row stride `stride`, rounded to bf16, into dst (pitch ld); rows at or past
// `end` are zero. Threads of the team share the work.
template <int HS>
BERTH_DEV void load_rows(bf16* dst, int ld, const float* src, int64_t stride, int row0, int end,
                         const Team& t) {
  for (int e = t.tid; e < kTile * HS; e += t.n) {
    const int r = e / HS, x = e % HS, row = row0 + r;
    dst[r * ld + x] = to_bf16(row < end ? src[int64_t(row) * stride + x] : 0.0f);
  }
}

// ---- forward: a block per (query tile, head) ----------------------------------------------------
template <int HS>
struct Forward {
  float* out;         // (N, C)
  float* lse;         // (N, NH)
  const float* qkv;   // (N, 3C)
  const int32_t* cu;  // S + 1
  int S, N, C, NH;

  static constexpr int kLd = HS + 8;  // bf16 pitch of Q, K, V tiles
  static constexpr int kLdO = HS + 4;
  // The block's shared memory, region by region; listed once for its size and its pointers.
  struct Shared {
    bf16 *q, *k, *v, *p;
    float *s, *o, *m, *l;
    int32_t* start;
  };
  static BERTH_TILES_HD Shared carve(tiles::SharedCarver& c) {
    Shared sm{};
    sm.q = c.take<bf16>(kTile * kLd), sm.k = c.take<bf16>(kTile * kLd);
    sm.v = c.take<bf16>(kTile * kLd), sm.s = c.take<float>(kTile * kLdS);
    sm.p = c.take<bf16>(kTile * kLdP), sm.o = c.take<float>(kTile * kLdO);
    sm.m = c.take<float>(kTile), sm.l = c.take<float>(kTile), sm.start = c.take<int32_t>(kTile);
    return sm;
  }
  static size_t shared_bytes() { return tiles::SharedCarver::bytes_of(carve); }
  int64_t blocks() const { return tile_blocks(N, NH); }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    tiles::SharedCarver carver{smem};
    const Shared sm = carve(carver);
    const Tile t = tile_of(block, N, NH);
    const int h = t.h, row0 = t.first, rows = t.count;
    const int64_t stride = 3 * int64_t(C);
    const float scale = 1.0f / sqrtf(float(HS));

    load_rows<HS>(sm.q, kLd, qkv + h * HS, stride, row0, N, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) sm.o[(e / HS) * kLdO + e % HS] = 0.0f;
    for (int r = team.tid; r < kTile; r += team.n) {
      sm.m[r] = body::neg_inf(), sm.l[r] = 0.0f;
      sm.start[r] = r < rows ? cu[body::sequence_of(row0 + r, cu, S)] : row0 + r;
    }
    team.sync();
    const int key_end = row0 + rows;  // causal: no row sees past the last one
    for (int k0 = sm.start[0]; k0 < key_end; k0 += kTile) {
      load_rows<HS>(sm.k, kLd, qkv + C + h * HS, stride, k0, key_end, team);
      load_rows<HS>(sm.v, kLd, qkv + 2 * C + h * HS, stride, k0, key_end, team);
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16;
        // warp-uniform skips: no row of this warp, or no key of the tile any row of it sees
        if (r0 >= rows || k0 > row0 + r0 + 15 || k0 + kTile <= sm.start[r0]) return;
        for (int n = 0; n < kTile; n += 16)  // S = Q·Kᵀ (16 × 64)
          mma_tile<false, true>(sm.s + r0 * kLdS + n, kLdS, false, sm.q + r0 * kLd, kLd,
                                sm.k + n * kLd, kLd, HS);
        ln.sync();
        for (int r = r0 + ln.lane; r < r0 + 16; r += ln.n) {  // online softmax, a row per lane
          const int i = row0 + r;
          float* sr = sm.s + r * kLdS;
          bf16* pr = sm.p + r * kLdP;
          float mx = body::neg_inf();
          for (int j = 0; j < kTile; j++) {
            const int key = k0 + j;
            sr[j] = r < rows && key >= sm.start[r] && key <= i ? sr[j] * scale : body::neg_inf();
            mx = sr[j] > mx ? sr[j] : mx;
          }
          if (mx == body::neg_inf()) {  // sees nothing here: P = 0, the running state stays
            for (int j = 0; j < kTile; j++) pr[j] = to_bf16(0.0f);
            continue;
          }
          const float m_new = sm.m[r] > mx ? sm.m[r] : mx, corr = expf(sm.m[r] - m_new);
          float sum = 0.0f;
          for (int j = 0; j < kTile; j++) {
            const float pj = expf(sr[j] - m_new);  // 0 for the keys it does not see
            pr[j] = to_bf16(pj);
            sum += pj;
          }
          sm.l[r] = sm.l[r] * corr + sum, sm.m[r] = m_new;
          for (int x = 0; x < HS; x++) sm.o[r * kLdO + x] *= corr;
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
        if (r < rows) out[int64_t(row0 + r) * C + h * HS + x] = sm.o[r * kLdO + x] / sm.l[r];
      }
      for (int r = w * 16 + ln.lane; r < w * 16 + 16; r += ln.n) {
        if (r < rows) lse[int64_t(row0 + r) * NH + h] = sm.m[r] + logf(sm.l[r]);
      }
    });
  }
};

// ---- backward: a block per (key tile, head); dQ by atomics --------------------------------------
// delta (N, NH) = Σ_x dO·O per (token, head), computed before (body::attention_row_dot); dqkv
// zeroed before: each block writes its keys' dK and dV rows and adds into dQ.
template <int HS>
struct Backward {
  float* dqkv;         // (N, 3C)
  const float* dout;   // (N, C)
  const float* lse;    // (N, NH)
  const float* delta;  // (N, NH)
  const float* qkv;    // (N, 3C)
  const int32_t* cu;   // S + 1
  int S, N, C, NH;

  static constexpr int kLd = HS + 8;
  static constexpr int kLdO = HS + 4;
  struct Shared {  // as Forward's
    bf16 *k, *v, *q, *d, *p, *ds;
    float *s, *dp, *dk, *dv, *dqt, *lse_t, *delta_t;
    int32_t* end;
  };
  static BERTH_TILES_HD Shared carve(tiles::SharedCarver& c) {
    Shared sm{};
    sm.k = c.take<bf16>(kTile * kLd), sm.v = c.take<bf16>(kTile * kLd);
    sm.q = c.take<bf16>(kTile * kLd), sm.d = c.take<bf16>(kTile * kLd);
    sm.s = c.take<float>(kTile * kLdS), sm.dp = c.take<float>(kTile * kLdS);
    sm.p = c.take<bf16>(kTile * kLdP), sm.ds = c.take<bf16>(kTile * kLdP);
    sm.dk = c.take<float>(kTile * kLdO), sm.dv = c.take<float>(kTile * kLdO);
    sm.dqt = c.take<float>(kWarps * 16 * 16), sm.lse_t = c.take<float>(kTile);
    sm.delta_t = c.take<float>(kTile), sm.end = c.take<int32_t>(kTile);
    return sm;
  }
  static size_t shared_bytes() { return tiles::SharedCarver::bytes_of(carve); }
  int64_t blocks() const { return tile_blocks(N, NH); }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    tiles::SharedCarver carver{smem};
    const Shared sm = carve(carver);
    const Tile t = tile_of(block, N, NH);
    const int h = t.h, key0 = t.first, keys = t.count;
    const int64_t stride = 3 * int64_t(C);
    const float scale = 1.0f / sqrtf(float(HS));

    load_rows<HS>(sm.k, kLd, qkv + C + h * HS, stride, key0, N, team);
    load_rows<HS>(sm.v, kLd, qkv + 2 * C + h * HS, stride, key0, N, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) {
      sm.dk[(e / HS) * kLdO + e % HS] = 0.0f, sm.dv[(e / HS) * kLdO + e % HS] = 0.0f;
    }
    for (int j = team.tid; j < kTile; j += team.n)  // one past the last query that sees key j
      sm.end[j] = j < keys ? cu[body::sequence_of(key0 + j, cu, S) + 1] : 0;
    team.sync();
    const int query_end = sm.end[keys - 1];  // documents run forward: the last key's ends last
    for (int q0 = key0; q0 < query_end; q0 += kTile) {
      load_rows<HS>(sm.q, kLd, qkv + h * HS, stride, q0, query_end, team);
      load_rows<HS>(sm.d, kLd, dout + h * HS, C, q0, query_end, team);
      for (int i = team.tid; i < kTile; i += team.n) {
        const bool in = q0 + i < query_end;
        sm.lse_t[i] = in ? lse[int64_t(q0 + i) * NH + h] : 0.0f;
        sm.delta_t[i] = in ? delta[int64_t(q0 + i) * NH + h] : 0.0f;
      }
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16;  // this warp's keys: key0 + r0 ... + 15
        if (r0 >= keys || q0 + kTile <= key0 + r0 ||
            q0 >= sm.end[r0 + 15 < keys ? r0 + 15 : keys - 1])
          return;  // warp-uniform: no key, or no query of the tile sees one of them
        for (int n = 0; n < kTile; n += 16) {  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × 64)
          mma_tile<false, true>(sm.s + r0 * kLdS + n, kLdS, false, sm.k + r0 * kLd, kLd,
                                sm.q + n * kLd, kLd, HS);
          mma_tile<false, true>(sm.dp + r0 * kLdS + n, kLdS, false, sm.v + r0 * kLd, kLd,
                                sm.d + n * kLd, kLd, HS);
        }
        ln.sync();
        for (int r = r0 + ln.lane; r < r0 + 16; r += ln.n) {  // a key row per lane
          const int key = key0 + r;
          for (int n = 0; n < kTile; n++) {
            const int i = q0 + n;
            const bool sees = r < keys && key <= i && i < sm.end[r];
            const float pv = sees ? expf(sm.s[r * kLdS + n] * scale - sm.lse_t[n]) : 0.0f;
            sm.p[r * kLdP + n] = to_bf16(pv);
            sm.ds[r * kLdP + n] = to_bf16(pv * (sm.dp[r * kLdS + n] - sm.delta_t[n]) * scale);
          }
        }
        ln.sync();
        for (int c = 0; c < HS; c += 16) {  // dV += Pᵀ·dO, dK += dSᵀ·Q (16 keys × HS)
          mma_tile<false, false>(sm.dv + r0 * kLdO + c, kLdO, true, sm.p + r0 * kLdP, kLdP,
                                 sm.d + c, kLd, kTile);
          mma_tile<false, false>(sm.dk + r0 * kLdO + c, kLdO, true, sm.ds + r0 * kLdP, kLdP,
                                 sm.q + c, kLd, kTile);
        }
        float* dq = sm.dqt + w * 256;
        for (int qb = 0; qb < kTile; qb += 16) {  // dQ += dS·K, this warp's 16 keys' share
          if (q0 + qb >= query_end) break;
          for (int c = 0; c < HS; c += 16) {
            mma_tile<true, false>(dq, 16, false, sm.ds + r0 * kLdP + qb, kLdP, sm.k + r0 * kLd + c,
                                  kLd, 16);
            ln.sync();
            for (int e = ln.lane; e < 256; e += ln.n) {
              const int i = q0 + qb + e / 16;
              if (i < query_end)
                body::atomic_add(dqkv + int64_t(i) * stride + h * HS + c + e % 16, dq[e]);
            }
            ln.sync();
          }
        }
      });
      team.sync();
    }
    tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
      for (int e = ln.lane; e < 16 * HS; e += ln.n) {
        const int r = w * 16 + e / HS, x = e % HS;
        if (r >= keys) continue;
        float* row = dqkv + int64_t(key0 + r) * stride + h * HS + x;
        row[C] = sm.dk[r * kLdO + x], row[2 * C] = sm.dv[r * kLdO + x];
      }
    });
  }
};

}  // namespace BERTH_TILES_EXECUTOR
}  // namespace berth::cuda::flash
