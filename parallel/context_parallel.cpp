#include "parallel/context_parallel.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

// The block a rank holds while it travels the ring.
struct Block {
  std::vector<float> k, v, dk, dv;
  std::vector<int32_t> seq, pos;
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

Block local_block(const float* k, const float* v, const int32_t* seq, const int32_t* pos, int n,
                  int C, bool grads) {
  const size_t nc = size_t(n) * size_t(C);
  Block b{std::vector<float>(k, k + nc), std::vector<float>(v, v + nc), {}, {},
          std::vector<int32_t>(seq, seq + n), std::vector<int32_t>(pos, pos + n)};
  if (grads) b.dk.assign(nc, 0.f), b.dv.assign(nc, 0.f);
  return b;
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

void ring_attention_forward(Communicator& cp, float* out, float* lse, const float* q,
                            const float* k, const float* v, const int32_t* seq,
                            const int32_t* pos, int n, int C, int NH, bool overlap) {
  check_same_n(cp, n);
  Block cur = local_block(k, v, seq, pos, n, C, false), next = cur;
  std::fill(out, out + int64_t(n) * C, 0.f);
  std::fill(lse, lse + int64_t(n) * NH, -std::numeric_limits<float>::infinity());
  std::vector<float> ob(size_t(n) * size_t(C)), lb(size_t(n) * size_t(NH));
  for (int t = 0; t < cp.size(); ++t) {
    // The next block travels while this one is computed (with `overlap`).
    const bool more = t + 1 < cp.size();
    if (more && overlap) pass_on(cp, cur, &next, true, false, true);
    cpu::attention_block_forward(ob.data(), lb.data(), q, cur.k.data(), cur.v.data(), seq, pos,
                                 cur.seq.data(), cur.pos.data(), n, n, C, NH);
    cpu::attention_lse_merge(out, lse, ob.data(), lb.data(), n, C, NH);
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

void ring_attention_backward(Communicator& cp, float* dq, float* dk, float* dv, const float* dout,
                             const float* out, const float* lse, const float* q, const float* k,
                             const float* v, const int32_t* seq, const int32_t* pos, int n, int C,
                             int NH, bool overlap) {
  check_same_n(cp, n);
  Block cur = local_block(k, v, seq, pos, n, C, true), next = cur;
  std::fill(dq, dq + int64_t(n) * C, 0.f);
  for (int t = 0; t < cp.size(); ++t) {
    // K and V of the next block travel while this block's gradients are computed (with
    // `overlap`); dK and dV follow once computed. After cp passes each block's gradients are back
    // at its owner; the last pass carries only the gradients.
    const bool more_kv = cp.size() > 1 && t + 1 < cp.size();
    if (more_kv && overlap) pass_on(cp, cur, &next, true, false, true);
    cpu::attention_block_backward(dq, cur.dk.data(), cur.dv.data(), dout, out, lse, q,
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
  std::copy(cur.dk.begin(), cur.dk.end(), dk);
  std::copy(cur.dv.begin(), cur.dv.end(), dv);
}

}  // namespace berth
