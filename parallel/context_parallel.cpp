#include "parallel/context_parallel.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "runtime/core/check.h"

namespace berth {
namespace {

// The block a rank holds while it travels the ring, in the backend's memory.
struct Block {
  DeviceBuffer<float> k, v, dk, dv;
  DeviceBuffer<int32_t> seq, pos;
  Block(Backend& be, int n, int C, bool grads)
      : k(be, int64_t(n) * C),
        v(be, int64_t(n) * C),
        dk(be, grads ? int64_t(n) * C : 0),
        dv(be, grads ? int64_t(n) * C : 0),
        seq(be, n),
        pos(be, n) {}
};

// Sends `b` to the next rank and receives the previous rank's block into `next`, in one group:
// K and V (with their sequence ids and positions) and/or their gradients. With `async` the group
// is only posted (Communicator::group_end_async); the caller computes, then calls cp.wait().
void pass_on(Communicator& cp, const Block& b, Block* next, bool with_kv, bool with_grads,
             bool async) {
  const int to = (cp.rank() + 1) % cp.size(), from = (cp.rank() - 1 + cp.size()) % cp.size();
  cp.group_begin();
  if (with_kv) {
    cp.send(b.k.data(), b.k.size(), DType::F32, to);
    cp.send(b.v.data(), b.v.size(), DType::F32, to);
    cp.send(b.seq.data(), b.seq.size(), DType::I32, to);
    cp.send(b.pos.data(), b.pos.size(), DType::I32, to);
    cp.recv(next->k.data(), next->k.size(), DType::F32, from);
    cp.recv(next->v.data(), next->v.size(), DType::F32, from);
    cp.recv(next->seq.data(), next->seq.size(), DType::I32, from);
    cp.recv(next->pos.data(), next->pos.size(), DType::I32, from);
  }
  if (with_grads) {
    cp.send(b.dk.data(), b.dk.size(), DType::F32, to);
    cp.send(b.dv.data(), b.dv.size(), DType::F32, to);
    cp.recv(next->dk.data(), next->dk.size(), DType::F32, from);
    cp.recv(next->dv.data(), next->dv.size(), DType::F32, from);
  }
  if (async) {
    cp.group_end_async();
  } else {
    cp.group_end();
  }
}

// This rank's own block (a copy: the ring overwrites what it holds), gradients zeroed.
void load_local(Backend& be, Block* b, const float* k, const float* v, const int32_t* seq,
                const int32_t* pos) {
  be.copy(b->k.data(), k, b->k.bytes());
  be.copy(b->v.data(), v, b->v.bytes());
  be.copy(b->seq.data(), seq, b->seq.bytes());
  be.copy(b->pos.data(), pos, b->pos.bytes());
  be.zero(b->dk.data(), b->dk.bytes());
  be.zero(b->dv.data(), b->dv.bytes());
}

// Debug builds check that every cp rank holds the same number of tokens (cp_local_batch makes
// them equal; a mismatch would otherwise surface as an MPI truncation error). One all-reduce of
// (n, −n) with MAX gives the largest and the smallest n.
void check_same_n([[maybe_unused]] Communicator& cp, [[maybe_unused]] int n) {
#ifndef NDEBUG
  if (cp.size() == 1) return;
  int64_t mm[2] = {n, -int64_t(n)};
  cp.all_reduce(mm, 2, ReduceOp::MAX);
  BERTH_CHECK(mm[0] == n && -mm[1] == n,
              "ring attention: every cp rank must hold the same number of tokens (this one: {}, "
              "others up to {} and down to {})",
              n, mm[0], -mm[1]);
#endif
}

}  // namespace

void ring_attention_forward(Backend& be, Communicator& cp, float* out, float* lse,
                            const float* q, const float* k, const float* v, const int32_t* seq,
                            const int32_t* pos, int n, int C, int NH, bool overlap) {
  check_same_n(cp, n);
  Block cur(be, n, C, false), next(be, n, C, false);
  load_local(be, &cur, k, v, seq, pos);
  be.zero(out, size_t(n) * size_t(C) * sizeof(float));
  be.fill(lse, int64_t(n) * NH, -std::numeric_limits<float>::infinity());
  DeviceBuffer<float> ob(be, int64_t(n) * C), lb(be, int64_t(n) * NH);
  for (int t = 0; t < cp.size(); ++t) {
    // The next block travels while this one is computed (with `overlap`). A stream-ordered
    // backend finishes the block before its buffers go on the wire.
    const bool more = t + 1 < cp.size();
    if (more && overlap) pass_on(cp, cur, &next, true, false, true);
    be.attention_block_forward(ob.data(), lb.data(), q, cur.k.data(), cur.v.data(), seq, pos,
                               cur.seq.data(), cur.pos.data(), n, n, C, NH);
    be.attention_lse_merge(out, lse, ob.data(), lb.data(), n, C, NH);
    if (more) {
      if (overlap) {
        cp.wait();
      } else {
        pass_on(cp, cur, &next, true, false, false);
      }
      std::swap(cur, next);
    }
  }
}

void ring_attention_backward(Backend& be, Communicator& cp, float* dq, float* dk, float* dv,
                             const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, const int32_t* seq,
                             const int32_t* pos, int n, int C, int NH, bool overlap) {
  check_same_n(cp, n);
  Block cur(be, n, C, true), next(be, n, C, true);
  load_local(be, &cur, k, v, seq, pos);
  be.zero(dq, size_t(n) * size_t(C) * sizeof(float));
  for (int t = 0; t < cp.size(); ++t) {
    // K and V of the next block travel while this block's gradients are computed (with
    // `overlap`); dK and dV follow once computed. After cp passes each block's gradients are back
    // at its owner; the last pass carries only the gradients.
    const bool more_kv = cp.size() > 1 && t + 1 < cp.size();
    if (more_kv && overlap) pass_on(cp, cur, &next, true, false, true);
    be.attention_block_backward(dq, cur.dk.data(), cur.dv.data(), dout, out, lse, q,
                                cur.k.data(), cur.v.data(), seq, pos, cur.seq.data(),
                                cur.pos.data(), n, n, C, NH);
    if (cp.size() > 1) {
      if (overlap) {
        cp.wait();
        pass_on(cp, cur, &next, false, true, false);
      } else {
        pass_on(cp, cur, &next, more_kv, true, false);
      }
      std::swap(cur, next);
    }
  }
  be.copy(dk, cur.dk.data(), cur.dk.bytes());
  be.copy(dv, cur.dv.data(), cur.dv.bytes());
}

}  // namespace berth
