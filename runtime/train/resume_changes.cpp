#include "runtime/train/resume_changes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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

// The same file: the same path, or one that resolves to the same place from here ("data/a.h5"
// and "/work/data/a.h5" run from /work, "./data//a.h5").
bool same_path(const std::string& a, const std::string& b) {
  if (a == b) return true;
  // (absolute first: weakly_canonical leaves a relative path relative when it does not exist)
  std::error_code ea, eb;
  const std::filesystem::path ca =
      std::filesystem::weakly_canonical(std::filesystem::absolute(a, ea), ea);
  const std::filesystem::path cb =
      std::filesystem::weakly_canonical(std::filesystem::absolute(b, eb), eb);
  if (ea || eb)
    return std::filesystem::path(a).lexically_normal() ==
           std::filesystem::path(b).lexically_normal();
  return ca == cb;
}

}  // namespace

std::string describe_resume_changes(const RunConfig& saved, int64_t saved_rows_per_step,
                                    const RunConfig& now, int64_t now_rows_per_step, int64_t step,
                                    int64_t rows_consumed, const std::string& saved_data,
                                    const std::string& now_data) {
  std::vector<std::string> data;
  // The data file: the same contents are the same data wherever they are now (a relative path
  // made absolute, a copy on another file system); without both fingerprints (an older
  // checkpoint), the same file by its path.
  if (!saved_data.empty() && !now_data.empty()) {
    if (saved_data != now_data) {
      if (same_path(saved.data.train, now.data.train))
        add(&data, "the contents of data.train", "(" + saved_data + ")", "(" + now_data + ")");
      else
        add(&data, "data.train", saved.data.train, now.data.train);
    }
  } else if (!same_path(saved.data.train, now.data.train)) {
    add(&data, "data.train", saved.data.train, now.data.train);
  }
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
      // The saved order is kept by data.pack_align = the saved alignment, where this layout
      // takes it (a multiple of 2·cp under context parallelism).
      const bool keepable = now.parallel.cp <= 1 || a.align % (2 * now.parallel.cp) == 0;
      data.push_back(fmt::format(
          "packing alignment {} → {}{}{}", a.align, b.align,
          now.data.pack_align == 0 && now.parallel.cp > 1
              ? fmt::format(" (automatic: 2·cp for parallel.cp = {})", now.parallel.cp)
              : std::string(),
          keepable ? fmt::format(" (--set data.pack_align={} keeps the saved order)", a.align)
                   : std::string()));
    }
  }

  std::vector<std::string> parts;
  if (!data.empty()) {
    parts.push_back(
        fmt::format("the data order differs from the saved run's ({}; rows_consumed "
                    "{} now points at other rows than it would have)",
                    joined(data), rows_consumed));
  }
  // The global batch: the loaders read one sequence of rows whatever its grouping into steps, so
  // the data goes on at the same row; the steps take more or fewer of them.
  if (saved_rows_per_step > 0 && now_rows_per_step > 0 && saved_rows_per_step != now_rows_per_step)
    parts.push_back(fmt::format(
        "the global batch is {} rows a step where the saved run's was {} (dp × micro_batch_size "
        "× microbatches; the data goes on at the same row, in steps of another size)",
        now_rows_per_step, saved_rows_per_step));
  // The schedule: the next step's learning rate (also past the saved run's end: a finished run
  // extended, whose saved schedule had decayed to its last rate); else the first of the later
  // steps both runs train whose rate differs (every one of up to 4096, else the first of 4096
  // evenly spread), so a change that shows only after a shared warm-up is named too.
  auto differs = [&](int64_t s) {
    const double a = lr_of(saved, s), b = lr_of(now, s);
    return std::fabs(b - a) > 1e-9 * std::max(std::fabs(a), 1e-30);
  };
  int64_t at = -1;
  constexpr int64_t kSamples = 4096;
  const int64_t last = std::min(saved.train.steps, now.train.steps);  // 0-based steps < last
  const int64_t span = last - (step + 1);                             // the later shared steps
  if (step < now.train.steps && differs(step)) {
    at = step;
  } else {
    for (int64_t k = 0; k < std::min(span, kSamples) && at < 0; ++k) {
      const int64_t s = step + 1 + (span <= kSamples ? k : k * (span - 1) / (kSamples - 1));
      if (differs(s)) at = s;
    }
  }
  if (at >= 0) {
    std::vector<std::string> sched;
    add(&sched, "train.steps", saved.train.steps, now.train.steps);
    add(&sched, "train.lr", saved.train.lr, now.train.lr);
    add(&sched, "train.lr_schedule", saved.train.lr_schedule, now.train.lr_schedule);
    add(&sched, "train.warmup_steps", saved.train.warmup_steps, now.train.warmup_steps);
    add(&sched, "train.min_lr", saved.train.min_lr, now.train.min_lr);
    // (1-based: the next step is step + 1; the steps before `at` + 1 have the saved rates)
    std::string before;
    if (at == step + 1)
      before = fmt::format(" (step {} is the same)", step + 1);
    else if (at > step + 1 && span <= kSamples)
      before = fmt::format(" (steps {}..{} are the same)", step + 1, at);
    else if (at > step)
      before = fmt::format(" (the first of {} steps sampled from {} on that differs)", kSamples,
                           step + 1);
    parts.push_back(fmt::format(
        "the learning rate of step {} is {:.3g} where the saved run's schedule gives {:.3g}{} ({})",
        at + 1, lr_of(now, at), lr_of(saved, at), before, joined(sched)));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace berth
