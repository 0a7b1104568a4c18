// AdamW over a range of a model's flat parameter buffer, with global grad-norm clipping.
//
// The optimizer owns moments m, v for the elements [range.begin, range.end) of the flat layout:
// the whole buffer without ZeRO, this rank's shard with ZeRO-1. Weight decay applies to tensors
// whose spec says `decay` (2-D weights), never to biases or LayerNorm parameters, also when a
// shard boundary cuts a tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/data_parallel.h"
#include "runtime/core/backend.h"
#include "runtime/model/gpt_config.h"

namespace berth {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = no clipping
};

class AdamW {
 public:
  // range: the elements this optimizer updates (default: all of the layout). The moments live on
  // `be` (the model's backend; null = the CPU backend) and the update runs there.
  AdamW(const ParamLayout& layout, const AdamWSettings& settings, ShardRange range = {0, -1},
        Backend* be = nullptr);

  // One AdamW step t = steps_taken()+1 at `lr` on params[range] with `range_grads` (the gradients
  // of the range only, range.size() values). `grad_norm` is the global L2 norm of the whole
  // gradient (computed by the caller, reduced over ranks); grads are scaled by
  // min(1, grad_clip / grad_norm) when clipping is on.
  void step(float* params, const float* range_grads, double lr, double grad_norm);

  const ShardRange& range() const { return range_; }
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // when restoring moments from a checkpoint
  // The moments of the range, through host memory (checkpoints).
  std::vector<float> m_host() const;
  std::vector<float> v_host() const;
  void set_moments(const float* m, const float* v);  // range.size() host values each

 private:
  const ParamLayout& layout_;
  AdamWSettings s_;
  ShardRange range_;
  Backend* be_;
  DeviceBuffer<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace berth
