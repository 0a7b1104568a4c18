// Tensor parallelism (Megatron-LM style): the few primitives through which TP enters model code.
// Each is the plain single-device op when the tp group is null or has one rank.
//
//   column-parallel linear: this rank holds output features [r·OC/tp, (r+1)·OC/tp) (rows of W and
//     b). Forward is local (identity on the replicated input); backward all-reduces dinp over tp.
//   row-parallel linear: this rank holds input features [r·IC/tp, (r+1)·IC/tp) (columns of W) and
//     gets that slice of the input. Forward all-reduces the partial outputs, then adds the
//     replicated bias once; backward is local (identity on the replicated dout).
//   vocabulary-parallel embedding: this rank holds wte rows [offset, offset + Vp/tp); each rank
//     looks up the tokens it holds (zero for the others), the rows are all-reduced over tp, then
//     the replicated position embedding is added.
//   vocabulary-parallel cross-entropy: this rank holds logits of vocabulary columns
//     [offset, offset + Vp/tp). The max, Σexp and target logit are reduced over tp; the full
//     logits are never gathered.
// Every buffer is in the memory of `be` and every op runs there (kernels/dispatch.h: float on that
// Backend, the CPU one when null; double on the CPU reference); collectives go through the
// Communicator (MPI on host buffers, NCCL on device buffers). T is float or double (the
// gradient-check model); collectives use the matching dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/core/backend.h"

namespace berth {

// out (N, OC_local) = inp (N, IC) · wᵀ (OC_local, IC) + b (OC_local, may be null).
template <typename T>
void column_linear_forward(Backend* be, T* out, const T* inp, const T* w, const T* b, int N, int IC,
                           int OC_local);
// The same into pre, then out = gelu(pre) (the MLP's first layer; one fused op where the backend
// has one).
template <typename T>
void column_linear_gelu_forward(Backend* be, T* out, T* pre, const T* inp, const T* w, const T* b,
                                int N, int IC, int OC_local);
// dinp (N, IC) = Σ_tp dout_local · w (all-reduced; overwritten), dw += doutᵀ · inp,
// db += Σ_n dout (when not null).
template <typename T>
void column_linear_backward(Backend* be, Communicator* tp, T* dinp, T* dw, T* db, const T* dout,
                            const T* inp, const T* w, int N, int IC, int OC_local);

// out (N, OC) = Σ_tp inp_local (N, IC_local) · wᵀ (OC, IC_local), then + b (OC, replicated).
template <typename T>
void row_linear_forward(Backend* be, Communicator* tp, T* out, const T* inp_local, const T* w,
                        const T* b, int N, int IC_local, int OC);
// dinp_local (N, IC_local) = dout · w (overwritten); dw += doutᵀ · inp_local; db += Σ_n dout
// (replicated: the same on every tp rank).
template <typename T>
void row_linear_backward(Backend* be, T* dinp_local, T* dw, T* db, const T* dout,
                         const T* inp_local, const T* w, int N, int IC_local, int OC);
// The same where inp_local = gelu(pre_local) (the MLP's second layer), giving the gradient of
// pre_local instead: dpre_local = (dout · w) ⊙ gelu'(pre_local) (overwritten; one fused op where
// the backend has one).
template <typename T>
void row_linear_gelu_backward(Backend* be, T* dpre_local, T* dw, T* db, const T* dout,
                              const T* inp_local, const T* w, const T* pre_local, int N,
                              int IC_local, int OC);

// out (N, C) = wte[tokens] + wpe[positions] with wte_local holding vocabulary rows
// [vocab_offset, vocab_offset + Vp_local).
template <typename T>
void vocab_parallel_embedding_forward(Backend* be, Communicator* tp, T* out, const int32_t* tokens,
                                      const int32_t* positions, const T* wte_local, const T* wpe,
                                      int N, int C, int Vp_local, int vocab_offset);
// dwte_local += dout at this rank's tokens; dwpe += dout at the positions (replicated).
template <typename T>
void vocab_parallel_embedding_backward(Backend* be, Communicator* tp, T* dwte_local, T* dwpe,
                                       const T* dout, const int32_t* tokens,
                                       const int32_t* positions, int N, int C, int Vp_local,
                                       int vocab_offset);

// losses (N) = logsumexp over the real vocabulary (columns < V) − logit of the target, 0 where
// target is −1; lse (N) saves the log-sum-exp for backward (tp > 1). logits_local (N, Vp_local)
// hold global columns [vocab_offset, vocab_offset + Vp_local).
template <typename T>
void vocab_parallel_cross_entropy_forward(Backend* be, Communicator* tp, T* losses, T* lse,
                                          const T* logits_local, const int32_t* targets, int N,
                                          int V, int Vp_local, int vocab_offset);
// dlogits_local = dloss · (softmax − onehot(target)) on this rank's columns; 0 on padded columns
// and rows with target −1. May alias logits_local.
template <typename T>
void vocab_parallel_cross_entropy_backward(Backend* be, Communicator* tp, T* dlogits_local,
                                           const T* logits_local, const T* lse,
                                           const int32_t* targets, T dloss, int N, int V,
                                           int Vp_local, int vocab_offset);

// This rank's share of a row-major (rows, cols) tensor: rows [r·rows/tp, …) or columns
// [r·cols/tp, …). Throws unless tp divides the sliced dimension.
std::vector<float> shard_rows(const float* full, int rows, int cols, int tp, int rank);
std::vector<float> shard_cols(const float* full, int rows, int cols, int tp, int rank);

}  // namespace berth
