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
using tiles::SharedLayout;
using tiles::Team;
using tiles::to_bf16;

constexpr int kTile = 64;  // queries per block (forward) and keys per block (backward)
constexpr int kWarps = 4;  // each owns 16 rows of the block's tile
constexpr int kThreads = kWarps * tiles::kWarpSize;
constexpr int kLdS = kTile + 4;  // fp32 pitch of a 64-wide score tile (pads shared-memory banks)
constexpr int kLdP = kTile + 8;  // bf16 pitch of a 64-wide probability tile

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
  struct Layout {
    size_t q, k, v, s, p, o, m, l, start, bytes;
    template <typename B>
    static constexpr Layout make() {
      SharedLayout sl;
      Layout L{};
      L.q = sl.add<B>(size_t(kTile) * kLd);
      L.k = sl.add<B>(size_t(kTile) * kLd);
      L.v = sl.add<B>(size_t(kTile) * kLd);
      L.s = sl.add<float>(size_t(kTile) * kLdS);
      L.p = sl.add<B>(size_t(kTile) * kLdP);
      L.o = sl.add<float>(size_t(kTile) * kLdO);
      L.m = sl.add<float>(kTile);
      L.l = sl.add<float>(kTile);
      L.start = sl.add<int32_t>(kTile);
      L.bytes = sl.bytes;
      return L;
    }
  };
  static constexpr size_t shared_bytes() { return Layout::template make<bf16>().bytes; }
  int64_t blocks() const { return int64_t((N + kTile - 1) / kTile) * NH; }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    constexpr Layout L = Layout::template make<bf16>();
    bf16* q = reinterpret_cast<bf16*>(smem + L.q);
    bf16* k = reinterpret_cast<bf16*>(smem + L.k);
    bf16* v = reinterpret_cast<bf16*>(smem + L.v);
    float* s = reinterpret_cast<float*>(smem + L.s);
    bf16* p = reinterpret_cast<bf16*>(smem + L.p);
    float* o = reinterpret_cast<float*>(smem + L.o);
    float* m = reinterpret_cast<float*>(smem + L.m);
    float* l = reinterpret_cast<float*>(smem + L.l);
    int32_t* start = reinterpret_cast<int32_t*>(smem + L.start);
    const int h = block % NH, row0 = (block / NH) * kTile;
    const int rows = N - row0 < kTile ? N - row0 : kTile;
    const int64_t stride = 3 * int64_t(C);
    const float scale = 1.0f / sqrtf(float(HS));

    load_rows<HS>(q, kLd, qkv + h * HS, stride, row0, N, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) o[(e / HS) * kLdO + e % HS] = 0.0f;
    for (int r = team.tid; r < kTile; r += team.n) {
      m[r] = body::neg_inf(), l[r] = 0.0f;
      start[r] = r < rows ? cu[body::sequence_of(row0 + r, cu, S)] : row0 + r;
    }
    team.sync();
    const int key_end = row0 + rows;  // causal: no row sees past the last one
    for (int k0 = start[0]; k0 < key_end; k0 += kTile) {
      load_rows<HS>(k, kLd, qkv + C + h * HS, stride, k0, key_end, team);
      load_rows<HS>(v, kLd, qkv + 2 * C + h * HS, stride, k0, key_end, team);
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16;
        // warp-uniform skips: no row of this warp, or no key of the tile any row of it sees
        if (r0 >= rows || k0 > row0 + r0 + 15 || k0 + kTile <= start[r0]) return;
        for (int n = 0; n < kTile; n += 16)  // S = Q·Kᵀ (16 × 64)
          mma_tile<false, true>(s + r0 * kLdS + n, kLdS, false, q + r0 * kLd, kLd, k + n * kLd, kLd,
                                HS);
        ln.sync();
        for (int r = r0 + ln.lane; r < r0 + 16; r += ln.n) {  // online softmax, a row per lane
          const int i = row0 + r;
          float* sr = s + r * kLdS;
          bf16* pr = p + r * kLdP;
          float mx = body::neg_inf();
          for (int j = 0; j < kTile; j++) {
            const int key = k0 + j;
            sr[j] = r < rows && key >= start[r] && key <= i ? sr[j] * scale : body::neg_inf();
            mx = sr[j] > mx ? sr[j] : mx;
          }
          if (mx == body::neg_inf()) {  // sees nothing here: P = 0, the running state stays
            for (int j = 0; j < kTile; j++) pr[j] = to_bf16(0.0f);
            continue;
          }
          const float m_new = m[r] > mx ? m[r] : mx, corr = expf(m[r] - m_new);
          float sum = 0.0f;
          for (int j = 0; j < kTile; j++) {
            const float pj = expf(sr[j] - m_new);  // 0 for the keys it does not see
            pr[j] = to_bf16(pj);
            sum += pj;
          }
          l[r] = l[r] * corr + sum, m[r] = m_new;
          for (int x = 0; x < HS; x++) o[r * kLdO + x] *= corr;
        }
        ln.sync();
        for (int c = 0; c < HS; c += 16)  // O += P·V (16 × HS)
          mma_tile<false, false>(o + r0 * kLdO + c, kLdO, true, p + r0 * kLdP, kLdP, v + c, kLd,
                                 kTile);
      });
      team.sync();
    }
    tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
      for (int e = ln.lane; e < 16 * HS; e += ln.n) {
        const int r = w * 16 + e / HS, x = e % HS;
        if (r < rows) out[int64_t(row0 + r) * C + h * HS + x] = o[r * kLdO + x] / l[r];
      }
      for (int r = w * 16 + ln.lane; r < w * 16 + 16; r += ln.n) {
        if (r < rows) lse[int64_t(row0 + r) * NH + h] = m[r] + logf(l[r]);
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
  struct Layout {
    size_t k, v, q, d, s, dp, p, ds, dk, dv, dq, lse, delta, end, bytes;
    template <typename B>
    static constexpr Layout make() {
      SharedLayout sl;
      Layout L{};
      L.k = sl.add<B>(size_t(kTile) * kLd);
      L.v = sl.add<B>(size_t(kTile) * kLd);
      L.q = sl.add<B>(size_t(kTile) * kLd);
      L.d = sl.add<B>(size_t(kTile) * kLd);
      L.s = sl.add<float>(size_t(kTile) * kLdS);
      L.dp = sl.add<float>(size_t(kTile) * kLdS);
      L.p = sl.add<B>(size_t(kTile) * kLdP);
      L.ds = sl.add<B>(size_t(kTile) * kLdP);
      L.dk = sl.add<float>(size_t(kTile) * kLdO);
      L.dv = sl.add<float>(size_t(kTile) * kLdO);
      L.dq = sl.add<float>(size_t(kWarps) * 16 * 16);
      L.lse = sl.add<float>(kTile);
      L.delta = sl.add<float>(kTile);
      L.end = sl.add<int32_t>(kTile);
      L.bytes = sl.bytes;
      return L;
    }
  };
  static constexpr size_t shared_bytes() { return Layout::template make<bf16>().bytes; }
  int64_t blocks() const { return int64_t((N + kTile - 1) / kTile) * NH; }

  BERTH_DEV void run(int block, const Team& team, unsigned char* smem) const {
    constexpr Layout L = Layout::template make<bf16>();
    bf16* k = reinterpret_cast<bf16*>(smem + L.k);
    bf16* v = reinterpret_cast<bf16*>(smem + L.v);
    bf16* q = reinterpret_cast<bf16*>(smem + L.q);
    bf16* d = reinterpret_cast<bf16*>(smem + L.d);
    float* s = reinterpret_cast<float*>(smem + L.s);
    float* dp = reinterpret_cast<float*>(smem + L.dp);
    bf16* p = reinterpret_cast<bf16*>(smem + L.p);
    bf16* ds = reinterpret_cast<bf16*>(smem + L.ds);
    float* dk = reinterpret_cast<float*>(smem + L.dk);
    float* dv = reinterpret_cast<float*>(smem + L.dv);
    float* dqt = reinterpret_cast<float*>(smem + L.dq);
    float* lse_t = reinterpret_cast<float*>(smem + L.lse);
    float* delta_t = reinterpret_cast<float*>(smem + L.delta);
    int32_t* end = reinterpret_cast<int32_t*>(smem + L.end);
    const int h = block % NH, key0 = (block / NH) * kTile;
    const int keys = N - key0 < kTile ? N - key0 : kTile;
    const int64_t stride = 3 * int64_t(C);
    const float scale = 1.0f / sqrtf(float(HS));

    load_rows<HS>(k, kLd, qkv + C + h * HS, stride, key0, N, team);
    load_rows<HS>(v, kLd, qkv + 2 * C + h * HS, stride, key0, N, team);
    for (int e = team.tid; e < kTile * HS; e += team.n) {
      dk[(e / HS) * kLdO + e % HS] = 0.0f, dv[(e / HS) * kLdO + e % HS] = 0.0f;
    }
    for (int j = team.tid; j < kTile; j += team.n)  // one past the last query that sees key j
      end[j] = j < keys ? cu[body::sequence_of(key0 + j, cu, S) + 1] : 0;
    team.sync();
    const int query_end = end[keys - 1];  // documents run forward: the last key's ends last
    for (int q0 = key0; q0 < query_end; q0 += kTile) {
      load_rows<HS>(q, kLd, qkv + h * HS, stride, q0, query_end, team);
      load_rows<HS>(d, kLd, dout + h * HS, C, q0, query_end, team);
      for (int i = team.tid; i < kTile; i += team.n) {
        const bool in = q0 + i < query_end;
        lse_t[i] = in ? lse[int64_t(q0 + i) * NH + h] : 0.0f;
        delta_t[i] = in ? delta[int64_t(q0 + i) * NH + h] : 0.0f;
      }
      team.sync();
      tiles::each_warp(team, kWarps, [&](int w, const Lanes& ln) {
        const int r0 = w * 16;  // this warp's keys: key0 + r0 ... + 15
        if (r0 >= keys || q0 + kTile <= key0 + r0 || q0 >= end[r0 + 15 < keys ? r0 + 15 : keys - 1])
          return;  // warp-uniform: no key, or no query of the tile sees one of them
        for (int n = 0; n < kTile; n += 16) {  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × 64)
          mma_tile<false, true>(s + r0 * kLdS + n, kLdS, false, k + r0 * kLd, kLd, q + n * kLd, kLd,
                                HS);
          mma_tile<false, true>(dp + r0 * kLdS + n, kLdS, false, v + r0 * kLd, kLd, d + n * kLd,
                                kLd, HS);
        }
        ln.sync();
        for (int r = r0 + ln.lane; r < r0 + 16; r += ln.n) {  // a key row per lane
          const int key = key0 + r;
          for (int n = 0; n < kTile; n++) {
            const int i = q0 + n;
            const bool sees = r < keys && key <= i && i < end[r];
            const float pv = sees ? expf(s[r * kLdS + n] * scale - lse_t[n]) : 0.0f;
            p[r * kLdP + n] = to_bf16(pv);
            ds[r * kLdP + n] = to_bf16(pv * (dp[r * kLdS + n] - delta_t[n]) * scale);
          }
        }
        ln.sync();
        for (int c = 0; c < HS; c += 16) {  // dV += Pᵀ·dO, dK += dSᵀ·Q (16 keys × HS)
          mma_tile<false, false>(dv + r0 * kLdO + c, kLdO, true, p + r0 * kLdP, kLdP, d + c, kLd,
                                 kTile);
          mma_tile<false, false>(dk + r0 * kLdO + c, kLdO, true, ds + r0 * kLdP, kLdP, q + c, kLd,
                                 kTile);
        }
        float* dq = dqt + w * 256;
        for (int qb = 0; qb < kTile; qb += 16) {  // dQ += dS·K, this warp's 16 keys' share
          if (q0 + qb >= query_end) break;
          for (int c = 0; c < HS; c += 16) {
            mma_tile<true, false>(dq, 16, false, ds + r0 * kLdP + qb, kLdP, k + r0 * kLd + c, kLd,
                                  16);
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
        row[C] = dk[r * kLdO + x], row[2 * C] = dv[r * kLdO + x];
      }
    });
  }
};

}  // namespace BERTH_TILES_EXECUTOR
}  // namespace berth::cuda::flash
