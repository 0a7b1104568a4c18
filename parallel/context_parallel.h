// Ring attention over the cp group (docs/parallelism.md, "Context parallelism"). Each rank holds
// the queries, keys and values of its zigzag shard (packing/cp_shard.h) with every token's
// sequence id and global position. Keys and values travel the ring: at each of cp steps a rank
// attends its queries to the block it holds (kernels/ops.h attention_block_forward, masked by
// sequence and global position), merges the partial result by its log-sum-exp, and passes the
// block on with one grouped send/recv. Backward: dQ accumulates locally; dK and dV travel with
// their block and are back at its owner after cp steps. With `overlap` the next block's transfer
// is posted before the current block is computed and completed after it (group_end_async /
// wait); in backward that covers K and V, while dK and dV go once computed.
// The per-block attention and the merge are Backend ops (runtime/core/backend.h) and every buffer
// lives in the backend's memory, so the CUDA backend with the NCCL communicator runs this same
// algorithm; the MPI communicator needs host memory, i.e. the CPU backend.
#pragma once

#include <cstdint>

#include "runtime/comm/communicator.h"
#include "runtime/core/backend.h"

namespace berth {

// out (n, C) and lse (n, NH) of this rank's n queries against every rank's keys. Collective over
// `cp`; every rank must hold the same n.
void ring_attention_forward(Backend& be, Communicator& cp, float* out, float* lse,
                            const float* q, const float* k, const float* v, const int32_t* seq,
                            const int32_t* pos, int n, int C, int NH, bool overlap = true);

// dq, dk, dv (n, C) overwritten, given the forward's out and lse and dout. Collective.
void ring_attention_backward(Backend& be, Communicator& cp, float* dq, float* dk, float* dv,
                             const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, const int32_t* seq,
                             const int32_t* pos, int n, int C, int NH, bool overlap = true);

}  // namespace berth
