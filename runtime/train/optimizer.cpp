#include "runtime/train/optimizer.h"

#include <cmath>

#include "kernels/ops.h"
#include "runtime/core/check.h"

namespace berth {

AdamW::AdamW(const ParamLayout& layout, const AdamWSettings& settings)
    : layout_(layout), s_(settings), m_(size_t(layout.total), 0.f), v_(size_t(layout.total), 0.f) {}

double AdamW::step(std::vector<float>& params, const std::vector<float>& grads, double lr) {
  BERTH_CHECK(params.size() == m_.size() && grads.size() == m_.size(),
              "optimizer buffers ({}) do not match parameters ({}) / gradients ({})", m_.size(),
              params.size(), grads.size());
  const double norm = std::sqrt(cpu::sum_squares(grads.data(), int64_t(grads.size())));
  float scale = 1.f;
  if (s_.grad_clip > 0 && norm > s_.grad_clip) scale = float(s_.grad_clip / norm);
  t_++;
  for (const ParamSpec& spec : layout_.specs) {
    const size_t o = size_t(spec.offset);
    cpu::adamw_update(params.data() + o, grads.data() + o, m_.data() + o, v_.data() + o, spec.numel,
                      float(lr), float(s_.beta1), float(s_.beta2), float(s_.eps),
                      spec.decay ? float(s_.weight_decay) : 0.f, scale, t_);
  }
  return norm;
}

}  // namespace berth
