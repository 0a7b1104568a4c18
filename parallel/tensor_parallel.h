// Tensor parallelism (Megatron-LM style): the few primitives through which TP enters model code.
// Each is the plain single-device op when the tp group has one rank.
//
//   column-parallel linear: this rank holds output features [r·OC/tp, (r+1)·OC/tp) (rows of W and
//     b). Forward is local (identity on the replicated input); backward all-reduces dinp over tp.
//   row-parallel linear: this rank holds input features [r·IC/tp, (r+1)·IC/tp) (columns of W) and
//     gets that slice of the input. Forward all-reduces the partial outputs, then adds the
//     replicated bias once; backward is local (identity on the replicated dout).
//   vocabulary-parallel cross-entropy: this rank holds logits of vocabulary columns
//     [offset, offset + Vp/tp). The max, Σexp and target logit are reduced over tp; the full
//     logits are never gathered.
// Host buffers, fp32, through the Communicator (MPI today, NCCL with the CUDA backend).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"

namespace berth {

// out (N, OC_local) = inp (N, IC) · wᵀ (OC_local, IC) + b (OC_local, may be null).
void column_linear_forward(float* out, const float* inp, const float* w, const float* b, int N,
                           int IC, int OC_local);
// dinp (N, IC) = Σ_tp dout_local · w (all-reduced; overwritten), dw += doutᵀ · inp,
// db += Σ_n dout (when not null).
void column_linear_backward(Communicator& tp, float* dinp, float* dw, float* db, const float* dout,
                            const float* inp, const float* w, int N, int IC, int OC_local);

// out (N, OC) = Σ_tp inp_local (N, IC_local) · wᵀ (OC, IC_local), then + b (OC, replicated).
void row_linear_forward(Communicator& tp, float* out, const float* inp_local, const float* w,
                        const float* b, int N, int IC_local, int OC);
// dinp_local (N, IC_local) = dout · w (overwritten); dw += doutᵀ · inp_local; db += Σ_n dout
// (replicated: the same on every tp rank).
void row_linear_backward(float* dinp_local, float* dw, float* db, const float* dout,
                         const float* inp_local, const float* w, int N, int IC_local, int OC);

// losses (N) = logsumexp over the real vocabulary (columns < V) − logit of the target, 0 where
// target is −1; lse (N) saves the log-sum-exp for backward. logits_local (N, Vp_local) hold global
// columns [vocab_offset, vocab_offset + Vp_local).
void vocab_parallel_cross_entropy_forward(Communicator& tp, float* losses, float* lse,
                                          const float* logits_local, const int32_t* targets, int N,
                                          int V, int Vp_local, int vocab_offset);
// dlogits_local = dloss · (softmax − onehot(target)) on this rank's columns; 0 on padded columns
// and rows with target −1. May alias logits_local.
void vocab_parallel_cross_entropy_backward(float* dlogits_local, const float* logits_local,
                                           const float* lse, const int32_t* targets, float dloss,
                                           int N, int V, int Vp_local, int vocab_offset);

// This rank's share of a row-major (rows, cols) tensor: rows [r·rows/tp, …) or columns
// [r·cols/tp, …). Initialization draws the full tensor from the seed and keeps the slice, so every
// layout starts from one rank's weights. Throws unless tp divides the sliced dimension.
std::vector<float> shard_rows(const float* full, int rows, int cols, int tp, int rank);
std::vector<float> shard_cols(const float* full, int rows, int cols, int tp, int rank);

}  // namespace berth
