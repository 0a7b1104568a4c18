// GPT-2, exactly: pre-LN blocks, LayerNorm eps 1e-5, GELU (tanh), attention scale 1/sqrt(HS),
// learned position embeddings, LM head tied to the token embedding over the padded vocabulary Vp.
//
// One flat parameter buffer (and one flat gradient buffer of the same layout) with named views;
// activations are allocated once for the largest batch (max_B × max_T) at construction, so a
// training step allocates nothing. The class is templated on the scalar: float trains, double is
// used by the gradient tests.
//
// Usage per step:   zero_grad(); loss_sum = forward(batch); backward(batch, 1/n_targets);
// forward() keeps the activations backward() needs; backward() accumulates (+=) into grads().
#pragma once

#include <cstdint>
#include <vector>

#include "packing/packed_batch.h"
#include "runtime/comm/communicator.h"
#include "runtime/model/gpt_config.h"

namespace berth {

template <typename T>
class GPT {
 public:
  GPT(const GPTConfig& cfg, int max_B, int max_T);

  const GPTConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  std::vector<T>& params() { return params_; }
  const std::vector<T>& params() const { return params_; }
  std::vector<T>& grads() { return grads_; }
  T* param(const std::string& name) { return params_.data() + layout_.find(name).offset; }
  T* grad(const std::string& name) { return grads_.data() + layout_.find(name).offset; }

  // GPT-2 init, seeded: weights N(0, 0.02), the two residual projections (attn.c_proj, mlp.c_proj)
  // N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1 / bias 0, padded vocabulary rows of wte 0.
  // Each tensor draws from its own stream seeded by (seed, name), so the values do not depend on
  // which other tensors a rank holds.
  void init_weights(uint64_t seed);

  // Runs the model on `batch` (B <= max_B, T <= max_T, positions < maxT) and returns the SUM of
  // the per-token cross-entropy losses over tokens whose target is not -1 (divide by
  // batch.n_targets() for the mean). Keeps activations for backward.
  double forward(const PackedBatch& batch);

  // Per-token losses of the last forward (N values, 0 where the target is -1).
  const T* losses() const { return losses_.data(); }

  // Backpropagates the last forward; `dloss` is d(total loss)/d(each token's loss), e.g.
  // 1/n_targets for a mean. Accumulates into grads().
  void backward(const PackedBatch& batch, T dloss);

  // Context parallelism: attention becomes ring attention over `cp` (null or size 1 = off). The
  // batch is then this rank's zigzag shard (packing/cp_shard.h): its positions are global and its
  // cu_seqlens mark the local pieces of each sequence. fp32 only.
  void set_context_parallel(Communicator* cp);

  void zero_grad();

  // Bytes held by parameters, gradients and activations.
  int64_t param_bytes() const { return int64_t(params_.size() * sizeof(T)); }
  int64_t activation_bytes() const { return activation_bytes_; }

 private:
  struct LayerActs {
    std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu;
  };

  struct LayerIdx {  // offsets of one block's tensors in the flat buffers
    int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
        fcproj_b;
  };
  T* P(int64_t offset) { return params_.data() + offset; }
  T* G(int64_t offset) { return grads_.data() + offset; }

  GPTConfig cfg_;
  ParamLayout layout_;
  int max_B_, max_T_;
  std::vector<T> params_, grads_;
  // activations: residual[l] is the input of layer l (residual[L] the input of ln_f)
  std::vector<std::vector<T>> residual_;
  std::vector<LayerActs> layers_;
  std::vector<T> lnf_, lnf_mean_, lnf_rstd_, logits_, losses_, scratch_;
  // backward scratch
  std::vector<T> dres_, dln_, dqkv_, datty_, dfch_, datt_;
  int64_t activation_bytes_ = 0;
  std::vector<LayerIdx> idx_;
  Communicator* cp_ = nullptr;
  std::vector<int32_t> cp_seq_;                        // sequence id of each local token
  std::vector<float> cp_q_, cp_k_, cp_v_, cp_dq_, cp_dk_, cp_dv_;  // ring attention scratch
  void attention_fwd(LayerActs& a, const PackedBatch& batch);
  void attention_bwd(LayerActs& a, const PackedBatch& batch);
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace berth
