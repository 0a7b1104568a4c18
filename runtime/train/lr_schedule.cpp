#include "runtime/train/lr_schedule.h"

#include <cmath>

#include "runtime/core/check.h"

namespace berth {

LrSchedule parse_lr_schedule(const std::string& name) {
  if (name == "constant") return LrSchedule::CONSTANT;
  if (name == "cosine") return LrSchedule::COSINE;
  BERTH_FAIL("unknown lr_schedule \"{}\"; use \"constant\" or \"cosine\"", name);
}

double lr_at(int64_t step, int64_t total_steps, double lr, double min_lr, int64_t warmup_steps,
             LrSchedule schedule) {
  if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  if (schedule == LrSchedule::CONSTANT) return lr;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return min_lr;
  double p = double(step - warmup_steps) / double(decay_steps);
  p = p < 0 ? 0 : (p > 1 ? 1 : p);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * p));
}

}  // namespace berth
