// Learning-rate schedules (pure). `step` is 0-based: the LR used for the update of step `step`.
//   warmup: lr·(step+1)/warmup_steps for step < warmup_steps
//   "constant": lr afterwards
//   "cosine":   min_lr + ½(lr − min_lr)(1 + cos(π·p)), p = (step − warmup)/(steps − warmup) ∈ [0,1)
#pragma once

#include <cstdint>
#include <string>

namespace berth {

enum class LrSchedule { CONSTANT, COSINE };

LrSchedule parse_lr_schedule(const std::string& name);  // throws Error on unknown names

double lr_at(int64_t step, int64_t total_steps, double lr, double min_lr, int64_t warmup_steps,
             LrSchedule schedule);

}  // namespace berth
