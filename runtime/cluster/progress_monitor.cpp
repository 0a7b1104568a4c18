#include "runtime/cluster/progress_monitor.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "runtime/core/check.h"
#include "runtime/core/clock.h"

namespace berth {
namespace {

constexpr size_t kHistory = 400;      // steps kept for the warnings
constexpr size_t kWarnWindow = 50;    // newest normal steps a warning looks at
constexpr size_t kMinWarnSteps = 10;  // fewer normal steps after warm-up: no warnings yet
constexpr double kDataBoundShare = 0.10;
constexpr double kCommBoundShare = 0.30;
constexpr double kStragglerRatio = 1.10;
constexpr double kStragglerSlowestShare = 0.60;
constexpr double kCheckpointShare = 0.10;
constexpr double kCheckpointTarget = 0.03;  // interval suggested to bring checkpoints to 3 %
constexpr int kWarningKinds = 6;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "1h30m"-style duration for `--by`, rounded up to 15 minutes.
std::string extension_hint(double seconds) {
  const int64_t quarters = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds / 900.0)));
  const int64_t h = quarters / 4, m = (quarters % 4) * 15;
  if (h == 0) return fmt::format("{}m", m);
  return m == 0 ? fmt::format("{}h", h) : fmt::format("{}h{}m", h, m);
}

// The last step S in (step, end_step] such that running to S, with S as the run's last step, takes
// at most `left` seconds (`step` itself when none does): normal steps at p.step_s, plus the
// checkpoints and evaluations among them at their learned costs, the last step's as the facts say
// (berth's final checkpoint and evaluation).
// Whether a run whose last step is `last` saves after it.
bool saves_after_last(const RunFacts& f, int64_t last) {
  return events_between(last - 1, last, f.ckpt_interval, f.final_ckpt) > 0;
}

// The last step a run may end at for steps start..last to take at most `left` seconds, with their
// checkpoints and evaluations (a save after `last` not counted with `last_save_free`: a leased
// run's stop reserve holds it).
int64_t steps_that_fit(const RunFacts& f, int64_t step, int64_t end_step, double left,
                       const Prediction& p, bool last_save_free) {
  auto cost = [&](int64_t last) {
    const int64_t saves = events_between(step, last, f.ckpt_interval, f.final_ckpt) -
                          (last_save_free && saves_after_last(f, last) ? 1 : 0);
    return static_cast<double>(last - step) * p.step_s +
           static_cast<double>(std::max<int64_t>(0, saves)) * p.ckpt_cost_s +
           static_cast<double>(events_between(step, last, f.eval_interval, f.final_eval)) *
               p.eval_cost_s;
  };
  int64_t lo = step, hi = end_step;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (cost(mid) <= left) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

const char* warning_name(WarningKind kind) {
  switch (kind) {
    case WarningKind::DataBound: return "data-bound";
    case WarningKind::CommBound: return "comm-bound";
    case WarningKind::Straggler: return "straggler";
    case WarningKind::Memory: return "memory";
    case WarningKind::Window: return "window";
    case WarningKind::Checkpoints: return "checkpoints";
  }
  return "?";
}

ProgressMonitor::ProgressMonitor(RunFacts facts, MonitorSettings settings)
    : facts_(facts),
      settings_(std::move(settings)),
      predictor_(std::move(facts)),
      active_blocks_(kWarningKinds, 0) {
  BERTH_CHECK(!settings_.rank_names.empty(), "progress monitor: rank_names is empty");
  BERTH_CHECK(
      settings_.rank_stage.empty() || settings_.rank_stage.size() == settings_.rank_names.size(),
      "progress monitor: {} rank stages for {} ranks", settings_.rank_stage.size(),
      settings_.rank_names.size());
  std::map<int, std::vector<size_t>> stages;  // ranks of each stage, in rank order
  for (size_t k = 0; k < settings_.rank_names.size(); ++k) stages[stage_of(k)].push_back(k);
  for (auto& [stage, members] : stages) stage_members_.push_back(std::move(members));
}

void ProgressMonitor::set_window_end(double window_end_unix, bool preempted,
                                     double stop_reserve_s) {
  settings_.window_end_unix = window_end_unix;
  settings_.preempted = preempted;
  settings_.stop_reserve_s = std::max(0.0, stop_reserve_s);
  // A window that has already closed still counts as one (the run overruns it), as at the start.
  facts_.lease_s =
      window_end_unix > 0 ? std::max(1e-3, window_end_unix - settings_.session_start_unix) : 0;
  predictor_.set_lease_s(facts_.lease_s);
}

const StepRecord& ProgressMonitor::observe(int64_t step, const std::vector<RankStepMetrics>& ranks,
                                           int64_t global_tokens, int64_t seq_len,
                                           const std::string& event) {
  BERTH_CHECK(ranks.size() == settings_.rank_names.size(),
              "progress monitor: {} rank records for {} ranks", ranks.size(),
              settings_.rank_names.size());
  StepRecord r;
  r.step = step;
  r.tokens = global_tokens;
  r.seq_len = seq_len;
  r.event = event;
  const double n = static_cast<double>(ranks.size());
  for (const RankStepMetrics& m : ranks) {
    r.duration_s = std::max(r.duration_s, m.wall_s);  // the step ends when its slowest rank does
    r.compute_s += m.compute_s / n;
    r.comm_s += m.comm_s / n;
    r.data_wait_s += m.data_wait_s / n;
    r.overhead_s += m.overhead_s / n;
    r.mem_gib = std::max(r.mem_gib, m.mem_gib);
    peak_mem_gib_ = std::max(peak_mem_gib_, m.mem_peak_gib);
  }
  predictor_.observe(r);
  // A step that only saved a checkpoint or evaluated is kept without that overhead, so that a run
  // that does so every step (interval 1) still has steps to warn about and a throughput.
  const bool netted = only_ckpt_or_eval(event);
  history_.push_back(Sample{step, event.empty(), netted, ranks});
  if (netted) {
    for (RankStepMetrics& m : history_.back().ranks) {
      m.wall_s = std::max(0.0, m.wall_s - m.overhead_s);
      m.overhead_s = 0;
    }
  }
  history_.back().ranks.shrink_to_fit();
  if (history_.size() > kHistory) history_.pop_front();
  last_ = std::move(r);
  return last_;
}

const StepRecord& ProgressMonitor::amend_last(double extra_s, const std::string& event) {
  BERTH_CHECK(!history_.empty(), "progress monitor: no step to amend");
  last_.duration_s += extra_s;
  last_.overhead_s += extra_s;
  last_.event += (last_.event.empty() ? "" : "+") + event;
  predictor_.amend_last(last_);
  // Its ranks' records stay the step without the extra time, as a netted step's are.
  Sample& s = history_.back();
  s.normal = false;
  s.netted = only_ckpt_or_eval(last_.event);
  return last_;
}

int ProgressMonitor::stage_of(size_t rank) const {
  return settings_.rank_stage.empty() ? 0 : settings_.rank_stage[rank];
}

std::vector<const ProgressMonitor::Sample*> ProgressMonitor::recent_normal(size_t n,
                                                                           size_t least) const {
  std::vector<const Sample*> out;
  const int64_t warm_end = facts_.start_step + facts_.warmup_steps;
  // Steps free of events; fewer than `least` of them (steps that save or evaluate often), the
  // netted ones too.
  for (const bool with_netted : {false, true}) {
    out.clear();
    for (auto it = history_.rbegin(); it != history_.rend() && out.size() < n; ++it) {
      if ((it->normal || (with_netted && it->netted)) && it->step > warm_end) out.push_back(&*it);
    }
    if (out.size() >= least) break;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

ProgressMonitor::StragglerStats ProgressMonitor::straggler_stats(
    const std::vector<const Sample*>& steps) const {
  const size_t nr = settings_.rank_names.size();
  StragglerStats st;
  st.busy.assign(nr, 0);
  st.slowest.assign(nr, 0);
  std::vector<std::vector<double>> ratio(nr);
  for (std::vector<double>& r : ratio) r.reserve(steps.size());
  std::vector<double> b(nr), sorted;
  for (const Sample* s : steps) {
    for (size_t k = 0; k < nr; ++k) {
      b[k] = std::max(0.0, s->ranks[k].wall_s - s->ranks[k].comm_s);
      st.busy[k] += b[k];
    }
    // Each rank against the median of the others of its pipeline stage (stages differ in work:
    // the last one has the LM head and the loss), and the slowest of each stage counted. One
    // sort per stage and step: the median without rank k is read off the sorted values around
    // k's place, so a report stays O(steps × ranks × log ranks) on thousands of ranks.
    for (const std::vector<size_t>& members : stage_members_) {
      const size_t m = members.size();
      if (m == 1) {
        ratio[members[0]].push_back(1.0);
        continue;
      }
      sorted.clear();
      for (size_t k : members) sorted.push_back(b[k]);
      std::sort(sorted.begin(), sorted.end());
      size_t slowest = members[0];  // the highest busy time; the lowest rank among equals
      for (size_t k : members) {
        if (b[k] > b[slowest]) slowest = k;
        // The others: `sorted` without one copy of b[k] (at `at`), m − 1 values.
        const size_t at = static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), b[k]) -
                                              sorted.begin());
        auto other = [&](size_t i) { return sorted[i < at ? i : i + 1]; };
        const size_t n = m - 1;
        const double ref = n % 2 ? other(n / 2) : 0.5 * (other(n / 2 - 1) + other(n / 2));
        ratio[k].push_back(ref > 0 ? b[k] / ref : 1.0);
      }
      st.slowest[slowest] += 1;
    }
  }
  // The candidate: the rank with the highest median ratio (spikes do not move a median).
  std::vector<double> med(nr);
  for (size_t k = 0; k < nr; ++k) med[k] = median(ratio[k]);
  st.worst = static_cast<size_t>(std::max_element(med.begin(), med.end()) - med.begin());
  st.is_straggler =
      med[st.worst] >= kStragglerRatio &&
      st.slowest[st.worst] >= kStragglerSlowestShare * static_cast<double>(steps.size());
  return st;
}

std::optional<ProgressWarning> ProgressMonitor::straggler_warning() const {
  const size_t nr = settings_.rank_names.size();
  // Consistently slower: the same rank passes the test in both halves of the newest normal
  // steps (up to twice the window). On shared or noisy machines one rank or another is slower
  // for a while; a rank that is slower in one half and not in the other is such noise, which no
  // host check would find.
  const std::vector<const Sample*> span = recent_normal(2 * kWarnWindow, 2 * kMinWarnSteps);
  if (nr < 2 || span.size() < 2 * kMinWarnSteps) return std::nullopt;
  const auto mid = span.begin() + static_cast<std::ptrdiff_t>(span.size() / 2);
  const StragglerStats older = straggler_stats({span.begin(), mid});
  const StragglerStats newer = straggler_stats({mid, span.end()});
  if (!older.is_straggler || !newer.is_straggler || older.worst != newer.worst) return std::nullopt;
  // What the message shows: the means over both halves of the rank and of the median other rank
  // of its stage, and the percentage between those two figures.
  const size_t worst = newer.worst;
  const double n = static_cast<double>(span.size());
  std::vector<double> others;
  for (size_t o = 0; o < nr; ++o)
    if (o != worst && stage_of(o) == stage_of(worst))
      others.push_back((older.busy[o] + newer.busy[o]) / n);
  const double mine = (older.busy[worst] + newer.busy[worst]) / n, ref = median(others);
  return ProgressWarning{
      WarningKind::Straggler,
      fmt::format("straggler: rank {} is busy {:.0f}% longer per step than the median of the "
                  "other ranks{} ({:.1f} ms vs {:.1f} ms of compute and data loading, means over "
                  "the last {} steps, slowest in {} of them and in both halves); the others wait "
                  "for it in collectives. Check that host for throttling, another job or CPU "
                  "binding, or exclude it",
                  settings_.rank_names[worst], ref > 0 ? (mine / ref - 1) * 100 : 0.0,
                  settings_.rank_stage.empty() ? "" : " of its pipeline stage", mine * 1e3,
                  ref * 1e3, span.size(), older.slowest[worst] + newer.slowest[worst])};
}

ProgressReport ProgressMonitor::report() const {
  ProgressReport r;
  r.prediction = predictor_.predict();
  r.step = last_.step;
  r.first_step = facts_.start_step;
  r.end_step = facts_.start_step + facts_.session_steps;
  r.elapsed_s = predictor_.elapsed_s();
  // Throughput over the newest normal steps (all steps while there are none), without the time
  // of evaluations and checkpoint saves (the first block came before any normal step and counted
  // them as training time).
  double tokens = 0, seconds = 0;
  std::vector<const Sample*> win = recent_normal(kWarnWindow, kMinWarnSteps);
  if (win.empty()) {
    for (const Sample& s : history_) win.push_back(&s);
  }
  for (const Sample* s : win) {
    double wall = 0;
    for (const RankStepMetrics& m : s->ranks) {
      wall = std::max(wall, m.wall_s - m.overhead_s);
      tokens += m.tokens;
    }
    seconds += wall;
  }
  const double nranks = static_cast<double>(settings_.rank_names.size());
  if (seconds > 0) {
    r.tokens_per_s = tokens / seconds;
    r.tokens_per_s_rank = r.tokens_per_s / nranks;
    r.model_flops_per_s = settings_.flops_per_token * r.tokens_per_s;
    if (settings_.peak_flops_per_rank > 0) {
      r.mfu = r.model_flops_per_s / (settings_.peak_flops_per_rank * nranks);
    }
  }
  r.peak_mem_gib = peak_mem_gib_;
  r.mem_capacity_gib = facts_.mem_capacity_gib;
  r.warnings = warnings(r);
  return r;
}

std::vector<ProgressWarning> ProgressMonitor::warnings(const ProgressReport& r) const {
  std::vector<ProgressWarning> out;
  const Prediction& p = r.prediction;
  const std::vector<const Sample*> win = recent_normal(kWarnWindow, kMinWarnSteps);
  const size_t nr = settings_.rank_names.size();
  if (std::optional<ProgressWarning> w = straggler_warning()) out.push_back(*w);
  if (win.size() >= kMinWarnSteps) {
    // A rank slower than the others in this window explains their waiting in collectives, whether
    // or not it is consistent enough for the straggler warning: that waiting is no sign of
    // communication a bigger batch would hide.
    const bool imbalanced = nr >= 2 && straggler_stats(win).is_straggler;
    // Shares of wall time, summed over the window.
    std::vector<double> wall(nr, 0), comm(nr, 0), data(nr, 0);
    for (const Sample* s : win) {
      for (size_t k = 0; k < nr; ++k) {
        const RankStepMetrics& m = s->ranks[k];
        // The bubble is waiting for other stages, not communication a bigger batch would hide.
        wall[k] += m.wall_s, comm[k] += m.comm_s - m.bubble_s, data[k] += m.data_wait_s;
      }
    }
    const double nwin = static_cast<double>(win.size());
    double wall_all = 0, comm_all = 0;
    size_t data_rank = 0;
    double data_share = 0;
    for (size_t k = 0; k < nr; ++k) {
      wall_all += wall[k], comm_all += comm[k];
      const double share = wall[k] > 0 ? data[k] / wall[k] : 0;
      if (share > data_share) data_share = share, data_rank = k;
    }
    if (data_share >= kDataBoundShare) {
      double mean_share = 0;
      for (size_t k = 0; k < nr; ++k) mean_share += wall[k] > 0 ? data[k] / wall[k] / nr : 0;
      out.push_back(
          {WarningKind::DataBound,
           fmt::format("data-loading bound: ranks wait for their batches {:.0f}% of step time "
                       "(worst {}: {:.0f}%, {:.1f} ms per step) over the last {} steps. Put the "
                       "dataset on local disk, reuse a cached packing plan (data.pack_plan), or "
                       "give each rank more CPU for loading",
                       mean_share * 100, settings_.rank_names[data_rank], data_share * 100,
                       data[data_rank] / nwin * 1e3, win.size())});
    }
    const double comm_share = wall_all > 0 ? comm_all / wall_all : 0;
    if (!imbalanced && nr >= 2 && comm_share >= kCommBoundShare) {
      out.push_back(
          {WarningKind::CommBound,
           fmt::format("communication bound: {:.0f}% of step time is exposed communication "
                       "(mean over {} ranks, last {} steps). Give each synchronization more work "
                       "(raise train.micro_batch_size or parallel.microbatches), keep tensor "
                       "parallelism inside a node, or use fewer, larger data-parallel replicas",
                       comm_share * 100, nr, win.size())});
    }
    // Memory: least-squares slope of each rank's memory over the window.
    if (facts_.mem_capacity_gib > 0) {
      for (size_t k = 0; k < nr; ++k) {
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        for (const Sample* s : win) {
          const double x = static_cast<double>(s->step), y = s->ranks[k].mem_gib;
          sx += x, sy += y, sxx += x * x, sxy += x * y;
        }
        const double den = nwin * sxx - sx * sx;
        if (den <= 0) continue;
        const double slope = (nwin * sxy - sx * sy) / den;  // GiB per step
        const double now = win.back()->ranks[k].mem_gib;
        const double span = static_cast<double>(win.back()->step - win.front()->step);
        const double rem = static_cast<double>(r.end_step - r.step);
        // A real trend: growth over the window above 1 % of use (and 1 MiB), passing capacity.
        if (slope <= 0 || slope * span < std::max(0.01 * now, 1.0 / 1024)) continue;
        if (now + slope * rem <= facts_.mem_capacity_gib) continue;
        const double cap = facts_.mem_capacity_gib;
        const std::string when =
            now < cap
                ? fmt::format("at this rate it passes the {:.2f} GiB capacity at step {} of {}",
                              cap, r.step + static_cast<int64_t>(std::ceil((cap - now) / slope)),
                              r.end_step)
                : fmt::format("it is above the {:.2f} GiB capacity, since about step {}", cap,
                              r.step - static_cast<int64_t>(std::floor((now - cap) / slope)));
        out.push_back({WarningKind::Memory,
                       fmt::format("memory: rank {} grows {:.1f} MiB per step (now {:.2f} GiB); "
                                   "{}. Look for state kept across steps, or lower "
                                   "train.micro_batch_size",
                                   settings_.rank_names[k], slope * 1024, now, when)});
        break;  // one rank is enough to act on
      }
    }
  }
  // A leased run must end its steps by the stop point, its reserve before the window's end (the
  // save after its last step lies in the reserve): the warning and its advice measured from the
  // window's end said nothing of a run that then stopped short, or advised train.steps that did
  // not fit either.
  const bool reserved = settings_.stop_reserve_s > 0;
  const double deadline = settings_.window_end_unix - settings_.stop_reserve_s;
  const double last_save = reserved && saves_after_last(facts_, r.end_step) ? p.ckpt_cost_s : 0.0;
  const double finish = settings_.session_start_unix + p.total_s - last_save;
  if (settings_.window_end_unix > 0 && finish > deadline) {
    const double shortfall = finish - deadline;
    const double left = deadline - (settings_.session_start_unix + r.elapsed_s);
    const int64_t fit =
        steps_that_fit(facts_, r.step, r.end_step, std::max(0.0, left), p, reserved);
    // Minutes, unless the times lie within minutes of each other (then seconds tell them apart).
    const bool close = settings_.session_start_unix + p.high_s - last_save - deadline < 600;
    auto at = [&](double t) { return close ? format_utc_iso(t) : format_utc_minute(t); };
    // The band too, when its ends fall in one minute (it read "band 12:01–12:01").
    const double band_lo = settings_.session_start_unix + p.low_s - last_save,
                 band_hi = settings_.session_start_unix + p.high_s - last_save;
    auto band_at = [&](double t) {
      return format_utc_minute(band_lo) == format_utc_minute(band_hi) ? format_utc_iso(t) : at(t);
    };
    // A window a preemption cut cannot be extended (the preemptor holds the devices after it).
    const std::string fix =
        settings_.preempted
            ? fmt::format(
                  "It was cut short by a preemption and cannot be extended: the run stops "
                  "before it with a checkpoint; continue under another booking with "
                  "--resume auto, or lower train.steps to about {}",
                  fit)
        : !settings_.reservation.empty()
            ? fmt::format("Extend it: `berth extend {} --by {}`, or lower train.steps to about {}",
                          settings_.reservation, extension_hint(shortfall + (p.high_s - p.total_s)),
                          fit)
            // progress.window_end, no booking of berth's: the window is the job's allocation
            : fmt::format(
                  "Lower train.steps to about {}, or get the job a window {} longer "
                  "(and move progress.window_end with it)",
                  fit, extension_hint(shortfall + (p.high_s - p.total_s)));
    const std::string ends =
        settings_.stop_reserve_s > 0
            ? fmt::format(
                  "the run must stop by {} ({} before the booked window ends at {}, to "
                  "save its checkpoint)",
                  at(deadline), format_duration(settings_.stop_reserve_s),
                  at(settings_.window_end_unix))
            : fmt::format("the booked window ends at {}", at(settings_.window_end_unix));
    out.push_back({WarningKind::Window,
                   fmt::format("window: {}, {} before the predicted {} ({}, band {}–{}). {}", ends,
                               format_duration(shortfall), reserved ? "end of its steps" : "finish",
                               at(finish), band_at(band_lo), band_at(band_hi), fix)});
  }
  // Only once a checkpoint was measured: before, checkpoint_s is a prior.
  // And only when the session has a periodic save to space out: a session whose one save is its
  // last step's (the result) has nothing to change, and was told to set checkpoint.interval = 0,
  // which saved the same.
  if (facts_.ckpt_interval > 0 && p.total_s > 0 && p.checkpoints_observed > 0 &&
      events_between(facts_.start_step, r.end_step - 1, facts_.ckpt_interval, -1) > 0 &&
      p.checkpoint_s >= kCheckpointShare * p.total_s) {
    const double share = p.checkpoint_s / p.total_s;
    const int64_t suggest = static_cast<int64_t>(
        std::ceil(static_cast<double>(facts_.ckpt_interval) * share / kCheckpointTarget));
    // An interval with no multiple before this session's last step saves no periodic checkpoint
    // in it: say so, and how the run then still ends with one.
    const bool periodic = (r.end_step - 1) / suggest > facts_.start_step / suggest;
    // (berth's checkpoint.final = false is final_ckpt -1, the interval deciding the last step)
    const std::string at_end = facts_.final_ckpt == 1
                                   ? "the final save stays"
                                   : "and checkpoint.final = true, for one save at the end";
    const std::string fix =
        periodic ? fmt::format("Raise checkpoint.interval from {} to about {} to bring it near 3%",
                               facts_.ckpt_interval, suggest)
                 : fmt::format(
                       "Near 3% this session saves no periodic checkpoint: set "
                       "checkpoint.interval = 0 ({}: ~{})",
                       at_end, format_duration(p.ckpt_cost_s));
    out.push_back({WarningKind::Checkpoints,
                   fmt::format("checkpoints: saving takes ~{} of this session ({:.0f}%). {}",
                               format_duration(p.checkpoint_s), share * 100, fix)});
  }
  return out;
}

std::vector<ProgressWarning> ProgressMonitor::due(const ProgressReport& r, int repeat_blocks) {
  std::vector<bool> active(kWarningKinds, false);
  std::vector<ProgressWarning> out;
  for (const ProgressWarning& w : r.warnings) {
    const int k = static_cast<int>(w.kind);
    active[k] = true;
    if (active_blocks_[k] % std::max(1, repeat_blocks) == 0) out.push_back(w);
  }
  for (int k = 0; k < kWarningKinds; ++k) active_blocks_[k] = active[k] ? active_blocks_[k] + 1 : 0;
  return out;
}

std::string format_count(double x) {
  if (x >= 1e9) return fmt::format("{:.1f}G", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.1f}M", x / 1e6);
  if (x >= 1e5) return fmt::format("{:.0f}k", x / 1e3);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

std::string format_progress(const ProgressReport& r, double session_start_unix, bool bar) {
  const Prediction& p = r.prediction;
  const double frac =
      r.end_step > 0 ? static_cast<double>(r.step) / static_cast<double>(r.end_step) : 0;
  std::string out = "[progress] ";
  if (bar) {
    const int n = 20, full = std::clamp(static_cast<int>(frac * n), 0, n);
    out += fmt::format("[{}{}] ", std::string(static_cast<size_t>(full), '#'),
                       std::string(static_cast<size_t>(n - full), '-'));
  }
  out += fmt::format("step {}/{} ({:.1f}%) | elapsed {} | remaining {} ±{} (ETA {}) | {} tok/s "
                     "({}/rank)",
                     r.step, r.end_step, frac * 100, format_duration(r.elapsed_s),
                     format_duration(p.remaining_s), format_duration(0.5 * (p.high_s - p.low_s)),
                     format_utc_minute(session_start_unix + p.total_s),
                     format_count(r.tokens_per_s), format_count(r.tokens_per_s_rank));
  if (r.mfu >= 0) {
    out += fmt::format(" | MFU {:.0f}%", r.mfu * 100);
  } else {
    out += fmt::format(" | {:.2f} GFLOP/s", r.model_flops_per_s / 1e9);
  }
  out += r.mem_capacity_gib > 0
             ? fmt::format(" | peak mem {:.2f}/{:.1f} GiB", r.peak_mem_gib, r.mem_capacity_gib)
             : fmt::format(" | peak mem {:.2f} GiB", r.peak_mem_gib);
  if (p.checkpoint_s > 0) out += " | checkpoints ~" + format_duration(p.checkpoint_s);
  return out;
}

}  // namespace berth
