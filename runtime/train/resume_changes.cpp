#include "runtime/train/resume_changes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/train/lr_schedule.h"
#include "runtime/train/packed_loader.h"

namespace berth {
namespace {

void add(std::vector<std::string>* out, const char* key, const std::string& a,
         const std::string& b) {
  if (a != b) out->push_back(fmt::format("{} {} → {}", key, a, b));
}
template <typename V>
void add(std::vector<std::string>* out, const char* key, V a, V b) {
  if (a != b) out->push_back(fmt::format("{} {} → {}", key, a, b));
}

std::string joined(const std::vector<std::string>& parts) {
  return fmt::format("{}", fmt::join(parts, ", "));
}

double lr_of(const RunConfig& c, int64_t step) {
  return lr_at(step, c.train.steps, c.train.lr, c.train.min_lr, c.train.warmup_steps,
               parse_lr_schedule(c.train.lr_schedule));
}

}  // namespace

std::string describe_resume_changes(const RunConfig& saved, int64_t saved_rows_per_step,
                                    const RunConfig& now, int64_t now_rows_per_step, int64_t step,
                                    int64_t rows_consumed, const std::string& saved_data,
                                    const std::string& now_data) {
  std::vector<std::string> data;
  add(&data, "data.train", saved.data.train, now.data.train);
  if (saved.data.train == now.data.train && !saved_data.empty() && !now_data.empty())
    add(&data, "the contents of data.train", "(" + saved_data + ")", "(" + now_data + ")");
  add(&data, "data.mode", saved.data.mode, now.data.mode);
  add(&data, "data.seq_len", saved.data.seq_len, now.data.seq_len);
  add(&data, "data.shuffle", saved.data.shuffle, now.data.shuffle);
  const bool packed = now.data.mode != "stream" && saved.data.mode == now.data.mode;
  // The seed orders the shuffled rows and the packing; an unshuffled stream does not use it.
  if (now.data.shuffle || now.data.mode != "stream")
    add(&data, "run.seed", saved.run.seed, now.run.seed);
  if (packed) {
    const PackOptions a = pack_options(saved, int(saved.parallel.cp));
    const PackOptions b = pack_options(now, int(now.parallel.cp));
    if (now.data.mode == "packed") {
      add(&data, "data.pack_algorithm", saved.data.pack_algorithm, now.data.pack_algorithm);
      add(&data, "data.pack_window", a.window, b.window);
    }
    add(&data, "data.long_docs", saved.data.long_docs, now.data.long_docs);
    if (a.align != b.align) {
      data.push_back(
          fmt::format("packing alignment {} → {}{}", a.align, b.align,
                      now.data.pack_align == 0 && now.parallel.cp > 1
                          ? fmt::format(" (automatic: 2·cp for parallel.cp = {})", now.parallel.cp)
                          : std::string()));
    }
  }
  if (saved_rows_per_step > 0 && now_rows_per_step > 0) {
    add(&data, "rows per step (dp × micro_batch_size × microbatches)", saved_rows_per_step,
        now_rows_per_step);
  }

  std::vector<std::string> parts;
  if (!data.empty()) {
    parts.push_back(
        fmt::format("the data order differs from the saved run's ({}; rows_consumed "
                    "{} now points at other rows than it would have)",
                    joined(data), rows_consumed));
  }
  // The schedule: only when it gives the next step another learning rate.
  const double lr_saved = lr_of(saved, step), lr_now = lr_of(now, step);
  if (std::fabs(lr_now - lr_saved) > 1e-9 * std::max(std::fabs(lr_saved), 1e-30)) {
    std::vector<std::string> sched;
    add(&sched, "train.steps", saved.train.steps, now.train.steps);
    add(&sched, "train.lr", saved.train.lr, now.train.lr);
    add(&sched, "train.lr_schedule", saved.train.lr_schedule, now.train.lr_schedule);
    add(&sched, "train.warmup_steps", saved.train.warmup_steps, now.train.warmup_steps);
    add(&sched, "train.min_lr", saved.train.min_lr, now.train.min_lr);
    parts.push_back(
        fmt::format("the learning rate of step {} is {:.3g} where the saved run's "
                    "schedule gives {:.3g} ({})",
                    step + 1, lr_now, lr_saved, joined(sched)));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace berth
