// AdamW over a model's flat parameter buffer, with global grad-norm clipping.
// Moments m, v are flat buffers of the same layout; weight decay applies to tensors whose spec
// says `decay` (2-D weights), never to biases or LayerNorm parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model/gpt_config.h"

namespace berth {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = no clipping
};

class AdamW {
 public:
  AdamW(const ParamLayout& layout, const AdamWSettings& settings);

  // Global L2 norm of `grads` (before clipping); then one AdamW step t = steps_taken()+1 at `lr`,
  // with grads scaled by min(1, grad_clip/norm) when clipping is on. Returns the norm.
  double step(std::vector<float>& params, const std::vector<float>& grads, double lr);

  int64_t steps_taken() const { return t_; }
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }

 private:
  const ParamLayout& layout_;
  AdamWSettings s_;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace berth
