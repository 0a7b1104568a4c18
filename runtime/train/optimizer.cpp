#include "runtime/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "runtime/core/check.h"

namespace berth {

AdamW::AdamW(const ParamLayout& layout, const AdamWSettings& settings, ShardRange range,
             Backend* be)
    : layout_(layout), s_(settings), range_(range), be_(be != nullptr ? be : &cpu_backend()) {
  if (range_.end < 0) range_ = ShardRange{0, layout.total};
  BERTH_CHECK(range_.begin >= 0 && range_.begin <= range_.end && range_.end <= layout.total,
              "optimizer range [{}, {}) outside the {} parameters", range_.begin, range_.end,
              layout.total);
  m_ = DeviceBuffer<float>(*be_, range_.size());
  v_ = DeviceBuffer<float>(*be_, range_.size());
  be_->zero(m_.data(), m_.bytes());
  be_->zero(v_.data(), v_.bytes());
}

std::vector<float> AdamW::m_host() const {
  std::vector<float> h(size_t(m_.size()));
  be_->download(h.data(), m_.data(), m_.bytes());
  return h;
}

std::vector<float> AdamW::v_host() const {
  std::vector<float> h(size_t(v_.size()));
  be_->download(h.data(), v_.data(), v_.bytes());
  return h;
}

void AdamW::set_moments(const float* m, const float* v) {
  be_->upload(m_.data(), m, m_.bytes());
  be_->upload(v_.data(), v, v_.bytes());
}

void AdamW::step(float* params, const float* range_grads, double lr, double grad_norm) {
  float scale = 1.f;
  if (s_.grad_clip > 0 && grad_norm > s_.grad_clip) scale = float(s_.grad_clip / grad_norm);
  t_++;
  for (const ParamSpec& spec : layout_.specs) {
    const int64_t lo = std::max(spec.offset, range_.begin);
    const int64_t hi = std::min(spec.offset + spec.numel, range_.end);
    if (lo >= hi) continue;
    const size_t o = size_t(lo - range_.begin);
    be_->adamw_update(params + lo, range_grads + o, m_.data() + o, v_.data() + o, hi - lo,
                      float(lr), float(s_.beta1), float(s_.beta2), float(s_.eps),
                      spec.decay ? float(s_.weight_decay) : 0.f, scale, t_);
  }
}

}  // namespace berth
