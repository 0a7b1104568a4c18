// GPT-2, exactly: pre-LN blocks, LayerNorm eps 1e-5, GELU (tanh), attention scale 1/sqrt(HS),
// learned position embeddings, LM head tied to the token embedding over the padded vocabulary Vp.
//
// One flat parameter buffer (and one flat gradient buffer of the same layout) with named views;
// activations are allocated once for the largest batch (max_B × max_T) at construction, so a
// training step allocates nothing. Every buffer lives in the memory of the model's Backend
// (runtime/core/backend.h; the CPU backend by default), every op runs on it, and a batch's tokens,
// targets, positions and cu_seqlens are uploaded into the slot it runs in; the `*_host` methods
// copy to and from host memory. The class is templated on the scalar: float trains, double is used
// by the gradient tests (on the CPU).
//
// Usage per step:   zero_grad(); loss_sum = forward(batch); backward(batch, 1/n_targets);
// forward() keeps the activations backward() needs; backward() accumulates (+=) into grads().
//
// Tensor parallelism enters only through the primitives of parallel/tensor_parallel.h (each the
// plain op without a tp group); pipeline parallelism from outside: a stage model holds some
// layers, and the executor (parallel/pipeline.h) moves activations and gradients between stages.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/dispatch.h"
#include "packing/packed_batch.h"
#include "runtime/comm/communicator.h"
#include "runtime/model/gpt_config.h"

namespace berth {

template <typename T>
class GPT {
 public:
  // `shard`: the part of the model this rank holds (a tensor-parallel slice of one pipeline
  // stage; the default is the whole model); `tp`: the tensor-parallel group (null or size 1 =
  // none; fp32 only when it has more ranks). `slots`: how many micro-batches' activations can be
  // held at once (the pipeline's micro-batches in flight on this stage); each slot holds one
  // max_B × max_T batch.
  // `backend`: where the buffers live and the ops run (null = the CPU backend). fp64 runs on the
  // CPU only.
  GPT(const GPTConfig& cfg, int max_B, int max_T, const ModelShard& shard = {},
      Communicator* tp = nullptr, int slots = 1, Backend* backend = nullptr);

  const GPTConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  const ParamLayout& layout() const { return layout_; }
  Backend& backend() const { return *mem_; }
  // The flat buffers, in the backend's memory.
  DeviceBuffer<T>& params() { return params_; }
  const DeviceBuffer<T>& params() const { return params_; }
  DeviceBuffer<T>& grads() { return grads_; }
  T* param(const std::string& name) { return params_.data() + layout_.find(name).offset; }
  T* grad(const std::string& name) { return grads_.data() + layout_.find(name).offset; }
  // Copies through host memory (a checkpoint, a comparison, an import).
  std::vector<T> params_host() const;
  std::vector<T> grads_host() const;
  void set_params(const std::vector<T>& host);
  int slots() const { return int(slots_.size()); }

  // GPT-2 init, seeded: weights N(0, 0.02), the two residual projections (attn.c_proj, mlp.c_proj)
  // N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1 / bias 0, padded vocabulary rows of wte 0.
  // Each full tensor draws from its own stream seeded by (seed, name) and this rank keeps its
  // slice, so every layout (tp, pp) starts from the same weights as one rank.
  void init_weights(uint64_t seed);

  // Runs this rank's part of the model on `batch` (B <= max_B, T <= max_T, positions < maxT),
  // keeping the activations in `slot` for backward. The first stage embeds the tokens; the others
  // start from stage_input(slot), which the previous stage's output was received into. The last
  // stage returns the SUM of the per-token cross-entropy losses over tokens whose target is not
  // -1 (divide by batch.n_targets() for the mean); other stages return 0 and leave their output
  // in stage_output(slot).
  double forward(const PackedBatch& batch, int slot = 0);

  // Per-token losses of the last forward in `slot` (N values, 0 where the target is -1; last
  // stage), on the host.
  const std::vector<T>& losses(int slot = 0) const { return slots_[size_t(slot)].losses_host; }

  // Backpropagates the forward held in `slot` and frees nothing (the slot is reused by the next
  // forward into it). `dloss` is d(total loss)/d(each token's loss), e.g. 1/n_targets for a mean.
  // Stages other than the last start from output_grad() (received from the next stage); stages
  // other than the first leave d(loss)/d(input) in input_grad(). Accumulates into grads().
  void backward(const PackedBatch& batch, T dloss, int slot = 0);

  // Pipeline buffers, (N, C) each: the activation received from the previous stage, the one
  // sent to the next, the gradient received from the next stage and the one sent to the previous.
  T* stage_input(int slot) { return slots_[size_t(slot)].residual.front().data(); }
  const T* stage_output(int slot) const { return slots_[size_t(slot)].residual.back().data(); }
  T* output_grad() { return dout_.data(); }
  const T* input_grad() const { return dres_.data(); }

  // Context parallelism: attention becomes ring attention over `cp` (null or size 1 = off). The
  // batch is then this rank's zigzag shard (packing/cp_shard.h): its positions are global and its
  // cu_seqlens mark the local pieces of each sequence. fp32 only.
  void set_context_parallel(Communicator* cp);

  void zero_grad();

  // Bytes held by parameters, gradients and activations (all slots).
  int64_t param_bytes() const { return int64_t(params_.bytes()); }
  int64_t activation_bytes() const { return activation_bytes_; }

 private:
  using Buf = DeviceBuffer<T>;
  struct LayerActs {
    Buf ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  // The activations of one micro-batch: residual[l] is the input of local layer l (residual[0]
  // the stage input, residual[L_local] its output / the input of ln_f), and the batch's index
  // arrays on the device.
  struct Slot {
    std::vector<Buf> residual;
    std::vector<LayerActs> layers;
    Buf lnf, lnf_mean, lnf_rstd, logits, losses, lse;
    std::vector<T> losses_host;
    DeviceBuffer<int32_t> tokens, targets, positions, cu_seqlens, seq_ids;
  };

  struct LayerIdx {  // offsets of one block's tensors in the flat buffers
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
        fcproj_b;
  };
  T* P(int64_t offset) { return params_.data() + offset; }
  T* G(int64_t offset) { return grads_.data() + offset; }
  void upload_batch(Slot& sl, const PackedBatch& batch);

  GPTConfig cfg_;
  ModelShard shard_;
  Backend* be_ = nullptr;  // null: the CPU backend (float) / reference (double)
  Backend* mem_;           // where the buffers live: be_, or the CPU backend
  Ops<T> ops_;
  Communicator* tp_ = nullptr;
  ParamLayout layout_;
  int max_B_, max_T_;
  int Cq_, NHl_, F_, Vpl_, voff_;  // local widths: q/k/v (C/tp), heads, MLP (4C/tp), vocabulary
  Buf params_, grads_;
  std::vector<Slot> slots_;
  Buf scratch_;
  // backward scratch (shared by the slots); dout_ receives the next stage's gradient
  Buf dres_, dout_, dln_, dqkv_, datty_, dfch_, datt_;
  int64_t activation_bytes_ = 0;
  std::vector<LayerIdx> idx_;
  Communicator* cp_ = nullptr;
  bool flash_ = false;  // attention by the flash-style varlen ops (the backend prefers them)
  Buf cp_q_, cp_k_, cp_v_, cp_dq_, cp_dk_, cp_dv_;  // ring attention scratch
  void split_qkv_for_ring(const LayerActs& a, int N);  // a.qkv into cp_q_, cp_k_, cp_v_
  void attention_fwd(LayerActs& a, Slot& sl, const PackedBatch& batch);
  void attention_bwd(LayerActs& a, Slot& sl, const PackedBatch& batch);
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;  // -1: not on this stage
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace berth
