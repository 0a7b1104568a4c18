#include "runtime/cluster/progress.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/core/fs.h"

namespace berth {
namespace {

// ---- model constants (phenomena-level, see docs/progress.md) -----------------------------------
constexpr int64_t kMinWindow = 30;  // recent window of normal steps: n/2 clamped to [30, 400]
constexpr int64_t kMaxWindow = 400;
constexpr double kWarmupTolerance =
    1.15;  // transient ends at the first step within 15 % of the steady rate
constexpr double kClipMads = 4.0;  // winsorize window rates at median ± 4 MAD (MAD >= 1 % of it)
constexpr double kStallFactor = 1.5;
// A level shift: the best split point's medians differ by this many standard errors (about 20
// split points are tried, so one lone test's 4 would let noise through) and 3 %.
constexpr double kShiftSe = 5.0;
// A stall is judged against the level of its block of kMinWindow steps and kLevelBlocks on each
// side (the median of their medians).
constexpr int64_t kLevelBlocks = 6;
constexpr double kWaitExcessShare = 0.02;   // a data wait 2 % of a step above its usual level
constexpr double kExcessPriorSteps = 50.0;  // unplanned overhead rate shrunk toward 0 by 50 steps
constexpr int64_t kWaitEndSteps = 10;       // quiet steps, at least, that end an episode of waits
// Priors for the extra cost of a checkpoint / eval step before one was seen, in median step times.
constexpr double kCkptPriorSteps = 100.0;
// Drift is followed when its slope is kDriftT standard errors from 0 over the whole span and
// kDriftHalfT over each half.
constexpr double kDriftT = 4.0;
constexpr double kDriftHalfT = 1.5;
// ... and the second half's slope >= half the first's, or within 3 standard errors of it (both
// fitted on rates clipped at a stall above and at the window's clip below)
constexpr double kDriftHalfRatio = 0.5;
constexpr double kEvalPriorSteps = 50.0;

bool is_warmup_event(const std::string& e) {
  return e.find("first_step") != std::string::npos || e.find("compile") != std::string::npos ||
         e.find("resume") != std::string::npos || e.find("warmup") != std::string::npos;
}
bool is_ckpt_event(const std::string& e) {
  return e.find("ckpt") != std::string::npos || e.find("checkpoint") != std::string::npos;
}
bool is_eval_event(const std::string& e) { return e.find("eval") != std::string::npos; }
bool is_epoch_event(const std::string& e) { return e.find("epoch") != std::string::npos; }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0)
    m = 0.5 * (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  return m;
}

double quantile_of(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Least-squares slope of y(k) on x(k) over k in [lo, hi), its standard error in *se (both 0 with
// fewer than 3 points or no spread in x).
template <class X, class Y>
double ols_slope(size_t lo, size_t hi, X x, Y y, double* se) {
  const double n = static_cast<double>(hi - lo);
  *se = 0;
  if (hi < lo + 3) return 0.0;
  double sx = 0, sy = 0;
  for (size_t k = lo; k < hi; ++k) sx += x(k), sy += y(k);
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (size_t k = lo; k < hi; ++k) {
    sxx += (x(k) - mx) * (x(k) - mx);
    sxy += (x(k) - mx) * (y(k) - my);
  }
  if (sxx <= 0) return 0.0;
  const double b = sxy / sxx;
  double rss = 0;
  for (size_t k = lo; k < hi; ++k) {
    const double e = y(k) - my - b * (x(k) - mx);
    rss += e * e;
  }
  *se = std::sqrt(rss / (n - 2) / sxx);
  return b;
}

// Number of multiples of `interval` in (a, b].
int64_t multiples_in(int64_t a, int64_t b, int64_t interval) {
  if (interval <= 0 || b <= a) return 0;
  return b / interval - a / interval;
}

// The '+'-separated parts of a step's event other than checkpoint saves and evaluations
// ("epoch_boundary" of "ckpt+epoch_boundary").
std::string other_events(const std::string& event) {
  std::stringstream ss(event);
  std::string part, out;
  while (std::getline(ss, part, '+'))
    if (!is_ckpt_event(part) && !is_eval_event(part)) out += (out.empty() ? "" : "+") + part;
  return out;
}

// What a checkpoint or evaluation step's save and evaluation took as the runtime measured them
// (overhead_s, at most the step), or -1 where its event names neither or none was measured.
double event_overhead(const StepRecord& r) {
  if (!is_ckpt_event(r.event) && !is_eval_event(r.event)) return -1;
  return r.overhead_s > 0 ? std::min(r.overhead_s, r.duration_s) : -1;
}

}  // namespace

int64_t events_between(int64_t after, int64_t last, int64_t interval, int at_last) {
  if (at_last < 0) return multiples_in(after, last, interval);
  return multiples_in(after, last - 1, interval) + (after < last ? at_last : 0);
}

bool only_ckpt_or_eval(const std::string& event) {
  return !event.empty() && other_events(event).empty();
}

double step_cost(int64_t tokens, int64_t seq_len, int64_t hidden_size) {
  const double attn = hidden_size > 0
                          ? static_cast<double>(seq_len) / (6.0 * static_cast<double>(hidden_size))
                          : 0.0;
  return static_cast<double>(tokens) * (1.0 + attn);
}

const ScheduleEntry& schedule_at(const RunFacts& facts, int64_t step) {
  BERTH_CHECK(!facts.schedule.empty(), "run facts have an empty schedule");
  const ScheduleEntry* cur = &facts.schedule.front();
  for (const auto& e : facts.schedule) {
    if (step - 1 >= e.from_step) cur = &e;
  }
  return *cur;
}

// ---- ProgressPredictor -----------------------------------------------------------------------

namespace {

// What a predictor needs of its run facts, named with `where` (a file, or "run facts").
void check_run_facts(const RunFacts& f, const std::string& where) {
  BERTH_CHECK(f.session_steps > 0, "{}: session_steps must be > 0, got {}", where, f.session_steps);
  BERTH_CHECK(f.start_step >= 0, "{}: start_step must be >= 0 (0 for a run from the start), got {}",
              where, f.start_step);
  BERTH_CHECK(
      f.session_steps <= kMaxPredictedSteps && f.start_step <= kMaxPredictedSteps - f.session_steps,
      "{}: start_step + session_steps = {} is beyond the {} steps the predictor "
      "forecasts (step by step)",
      where, f.start_step + f.session_steps, kMaxPredictedSteps);
  BERTH_CHECK(f.hidden_size > 0, "{}: hidden_size must be > 0, got {}", where, f.hidden_size);
  BERTH_CHECK(!f.schedule.empty(),
              "{}: schedule needs at least one [from_step, seq_len, tokens_per_step] entry", where);
  BERTH_CHECK(f.ckpt_interval >= 0 && f.eval_interval >= 0 && f.lease_s >= 0 &&
                  f.ckpt_prior_s >= 0 && f.eval_prior_steps >= 0,
              "{}: ckpt_interval, eval_interval, lease_s and the priors must be >= 0", where);
  for (const auto& e : f.schedule) {
    BERTH_CHECK(e.seq_len > 0 && e.tokens_per_step > 0,
                "{}: schedule entry from step {} has seq_len {} and tokens_per_step {}; both must "
                "be > 0",
                where, e.from_step, e.seq_len, e.tokens_per_step);
  }
}

}  // namespace

ProgressPredictor::ProgressPredictor(RunFacts facts) : facts_(std::move(facts)) {
  check_run_facts(facts_, "run facts");
  std::stable_sort(
      facts_.schedule.begin(), facts_.schedule.end(),
      [](const ScheduleEntry& a, const ScheduleEntry& b) { return a.from_step < b.from_step; });
}

void ProgressPredictor::set_lease_s(double lease_s) {
  BERTH_CHECK(lease_s >= 0, "run facts: lease_s must be >= 0, got {}", lease_s);
  facts_.lease_s = lease_s;
}

void ProgressPredictor::observe(const StepRecord& r) {
  const int64_t first = facts_.start_step + 1, last = facts_.start_step + facts_.session_steps;
  BERTH_CHECK(r.step >= first && r.step <= last,
              "step {} is outside this session (global steps {}..{})", r.step, first, last);
  BERTH_CHECK(records_.empty() || r.step > records_.back().step,
              "steps must arrive in increasing order: {} after {}", r.step, records_.back().step);
  BERTH_CHECK(r.duration_s >= 0.0 && std::isfinite(r.duration_s),
              "step {}: duration_s must be finite and >= 0, got {}", r.step, r.duration_s);
  records_.push_back(r);
  elapsed_s_ += r.duration_s;
}

void ProgressPredictor::amend_last(const StepRecord& r) {
  BERTH_CHECK(!records_.empty() && r.step == records_.back().step,
              "only the newest observed step can be amended (step {})", r.step);
  BERTH_CHECK(r.duration_s >= 0.0 && std::isfinite(r.duration_s),
              "step {}: duration_s must be finite and >= 0, got {}", r.step, r.duration_s);
  elapsed_s_ += r.duration_s - records_.back().duration_s;
  records_.back() = r;
}

Prediction ProgressPredictor::predict() const {
  BERTH_CHECK(!records_.empty(),
              "no step observed yet: the predictor needs at least one finished step");
  const int64_t h = facts_.hidden_size;
  const int64_t end_step = facts_.start_step + facts_.session_steps;
  const int64_t last_step = records_.back().step;

  // Normal steps: no event, not the session's first row. Rates are seconds per cost unit.
  // The configured warm-up steps are left out while later ones exist. When no step is free of
  // events (checkpoint.interval or eval.interval 1), the steps whose only events are checkpoints
  // and evaluations count, less their measured overhead (overhead_s): what is left is the step.
  bool any_plain = false;
  for (size_t i = 1; i < records_.size() && !any_plain; ++i)
    any_plain = records_[i].event.empty() && records_[i].tokens > 0;
  std::vector<size_t> normal;
  std::vector<double> rate, cost;
  for (int64_t warm = facts_.start_step + facts_.warmup_steps; normal.empty(); warm = 0) {
    for (size_t i = 0; i < records_.size(); ++i) {
      const auto& r = records_[i];
      const bool netted = !any_plain && only_ckpt_or_eval(r.event);
      if (i == 0 || (!r.event.empty() && !netted) || r.tokens <= 0 || r.step <= warm) continue;
      normal.push_back(i);
      cost.push_back(
          step_cost(r.tokens, r.seq_len > 0 ? r.seq_len : schedule_at(facts_, r.step).seq_len, h));
      rate.push_back(std::max(0.0, r.duration_s - (netted ? r.overhead_s : 0.0)) / cost.back());
    }
    if (warm == 0) break;
  }

  Prediction out;
  if (normal.empty()) {  // only warm-up or event rows so far: assume the steady step costs what
                         // the newest row did
    const auto& r = records_.back();
    const double per = r.duration_s;
    const double rem = per * static_cast<double>(end_step - last_step);
    out.total_s = elapsed_s_ + rem;
    out.remaining_s = rem;
    out.low_s = elapsed_s_;
    out.high_s = elapsed_s_ + 2.0 * rem;
    out.lease_exceeded = facts_.lease_s > 0 && out.total_s > facts_.lease_s;
    out.step_s = per;
    return out;
  }

  // Warm-up transient: skip leading normal steps slower than 1.15× the median of the later half.
  size_t begin = 0;
  {
    const std::vector<double> later(rate.begin() + static_cast<std::ptrdiff_t>(rate.size() / 2),
                                    rate.end());
    const double steady = median_of(later);
    while (begin + 1 < rate.size() && begin < rate.size() / 2 &&
           rate[begin] > kWarmupTolerance * steady)
      ++begin;
  }
  const int64_t n_post = static_cast<int64_t>(rate.size() - begin);
  const int64_t window = std::clamp<int64_t>(n_post / 2, kMinWindow, kMaxWindow);
  size_t wbegin =
      std::max<size_t>(begin, rate.size() - static_cast<size_t>(std::min<int64_t>(window, n_post)));
  // A growing data wait is no new level. Late in an epoch, or while a shuffle buffer drains, an
  // input pipeline waits longer and longer, and recovers at the epoch's end; a change of the
  // model's or the batch's cost (compute, communication) stays, and so does a data wait that rose
  // once and stays flat (a slower file system). Waits above their usual level (the median since
  // the warm-up, by more than kClipMads MADs and 2 % of a step) form episodes; the excess of an
  // episode that has ended, or of the newest one still on when it keeps growing or repeats an
  // earlier one, is taken out of its steps' rates, so that neither the level-shift nor the drift
  // detection follows it, and counted with the unplanned overhead (or, once a whole data epoch has
  // been seen, in its profile), up to what the step took above the rate before the episode. A
  // flat excess still on, or a ramp that has levelled off, stays in the rate.
  std::vector<double> wait_excess(records_.size(), 0.0);
  std::vector<char> wait_repeats(records_.size(), 0);  // ... and is a cost that recurs
  {
    std::vector<double> waits, durations;
    for (size_t k = begin; k < rate.size(); ++k) {
      waits.push_back(records_[normal[k]].data_wait_s);
      durations.push_back(records_[normal[k]].duration_s);
    }
    const double wait_ref = median_of(waits);
    for (double& w : waits) w = std::fabs(w - wait_ref);
    const double floor =
        std::max(kClipMads * 1.4826 * median_of(waits), kWaitExcessShare * median_of(durations));
    auto excess_of = [&](size_t k) {
      const auto& r = records_[normal[k]];
      return std::min(r.data_wait_s - wait_ref, r.duration_s);
    };
    auto step_of = [&](size_t k) { return static_cast<double>(records_[normal[k]].step); };
    // Episodes of excess waits: a run that ends at a step with an excess and reaches back over
    // blocks of kMinWindow steps of which at least half have one; two such runs fewer than
    // 2 * kMinWindow steps apart are one (a cache hit now and then inside a slow spell); at least
    // 2 * kMinWindow steps.
    struct Episode {
      size_t k0, k1;  // its first step with an excess, one past its last
    };
    std::vector<Episode> episodes;  // newest first
    for (size_t e = rate.size(); e > begin;) {
      size_t k1 = e;
      while (k1 > begin && excess_of(k1 - 1) <= floor) --k1;
      if (k1 == begin) break;
      size_t k0 = k1;
      for (size_t hi = k1; hi > begin;) {
        const size_t lo = hi - std::min(hi - begin, static_cast<size_t>(kMinWindow));
        size_t hits = 0, first = hi;
        for (size_t k = lo; k < hi; ++k)
          if (excess_of(k) > floor) first = std::min(first, k), ++hits;
        if (2 * hits < hi - lo) break;
        k0 = first, hi = lo;
      }
      while (k0 > begin && k0 < k1 && excess_of(k0 - 1) > floor) --k0;  // and the run it starts in
      e = std::min(k0, k1 - 1);
      if (k0 == k1) continue;
      if (!episodes.empty() && episodes.back().k0 - k1 < static_cast<size_t>(2 * kMinWindow))
        episodes.back().k0 = k0;
      else
        episodes.push_back({k0, k1});
    }
    std::erase_if(episodes, [](const Episode& ep) {
      return ep.k1 - ep.k0 < static_cast<size_t>(2 * kMinWindow);
    });
    size_t recurs = 0;  // the longest earlier transient episode that recurs (0: none)
    for (size_t j = episodes.size(); j-- > 0;) {  // oldest first
      const auto [k0, k1] = episodes[j];
      // One that has ended was transient: the steps right after it without an excess are at least
      // kWaitEndSteps and more than its longest quiet stretch, and the steps up to the next
      // episode have a median excess below a quarter of its mean (the epoch ended, the loader
      // caught up). So is the newest one, still on, when it repeats an earlier transient one (at
      // most 1.25 times as long so far: a slowdown that outlasts every spell before it is a level)
      // or when it grows: its line rises by 3 standard errors and by half its mean excess across
      // it, the line of its newest 60 steps is not clearly flatter (below half its slope, within 2
      // of its own standard errors of 0 and 3 below it: a wait that levelled off is a level,
      // however noisy), and it has lasted no longer than the steady stretch before it (a wait that
      // has grown since the start is a trend, not the late part of an epoch). An older one that did
      // not end (a slow spell broken by a stretch of cache hits) stays in the rate.
      double mean = 0;
      size_t quiet = 0, longest_quiet = 0;
      for (size_t k = k0; k < k1; ++k) {
        mean += excess_of(k);
        quiet = excess_of(k) > floor ? 0 : quiet + 1;
        longest_quiet = std::max(longest_quiet, quiet);
      }
      mean /= static_cast<double>(k1 - k0);
      const size_t next = j > 0 ? episodes[j - 1].k0 : rate.size();
      std::vector<double> after;
      size_t quiet_after = 0;  // steps without an excess right after it
      for (size_t k = k1; k < next; ++k) {
        after.push_back(excess_of(k));
        quiet_after += quiet_after == after.size() - 1 && after.back() <= floor;
      }
      const bool ended =
          quiet_after > std::max(static_cast<size_t>(kWaitEndSteps) - 1, longest_quiet) &&
          median_of(after) < 0.25 * mean;
      bool transient = ended || (j == 0 && 4 * (k1 - k0) <= 5 * recurs);
      double se = 0;
      const double slope = ols_slope(k0, k1, step_of, excess_of, &se);
      if (!transient && j == 0) {
        double se2 = 0;
        const double slope2 = ols_slope(k1 - 2 * kMinWindow, k1, step_of, excess_of, &se2);
        const double span = step_of(k1 - 1) - step_of(k0);
        // (a wait of one exact value over those steps has se2 = 0 and a slope2 of 0 or rounding:
        // flat, which "within 2 se of 0" alone refused)
        const double rounding = 1e-9 * mean / static_cast<double>(2 * kMinWindow);
        const bool levelled = slope2 < 0.5 * slope && std::fabs(slope2) < 2 * se2 + rounding &&
                              slope - slope2 > 3 * se2;
        transient =
            slope > 3 * se && slope * span > 0.5 * mean && !levelled && k0 - begin >= k1 - k0;
      }
      // What is taken out of a step is at most what it took above the rate before the episode,
      // or after it where that is lower (an ended one with kMinWindow steps after it) or where
      // nothing came before (the session began in it): a wait that overlaps compute (the loader
      // reports it, the step is no slower) is no excess. With neither, nothing is taken out.
      const size_t pre = k0 - std::min(k0 - begin, static_cast<size_t>(window));
      const bool rate_after = ended && after.size() >= static_cast<size_t>(kMinWindow);
      if (!transient || (k0 == pre && !rate_after) || mean <= 0) continue;
      // Its excess counts with the unplanned overhead, a cost the rest of the run repeats,
      // unless it ended near the start and fell while it lasted: a cold cache that warms is a
      // one-off, already in the elapsed time (one that rose or stayed, then ended, is the late
      // part of a short epoch).
      const bool one_off = ended && k0 - begin < k1 - k0 && slope < -3 * se;
      if (!one_off) recurs = std::max(recurs, k1 - k0);
      double pre_rate =
          k0 > pre ? median_of(std::vector<double>(rate.begin() + static_cast<std::ptrdiff_t>(pre),
                                                   rate.begin() + static_cast<std::ptrdiff_t>(k0)))
                   : std::numeric_limits<double>::infinity();
      if (rate_after)
        pre_rate = std::min(pre_rate, median_of(std::vector<double>(
                                          rate.begin() + static_cast<std::ptrdiff_t>(k1),
                                          rate.begin() + static_cast<std::ptrdiff_t>(next))));
      for (size_t k = k0; k < k1; ++k) {
        const double excess = std::min(
            excess_of(k), std::max(0.0, records_[normal[k]].duration_s - pre_rate * cost[k]));
        if (excess <= floor) continue;
        wait_excess[normal[k]] = excess;
        wait_repeats[normal[k]] = !one_off;
        rate[k] = std::max(0.0, rate[k] - excess / cost[k]);
      }
    }
  }
  auto median_mad = [&](size_t from, double* m, double* d) {
    std::vector<double> v(rate.begin() + static_cast<std::ptrdiff_t>(from), rate.end());
    *m = median_of(v);
    for (double& x : v) x = std::fabs(x - *m);
    *d = 1.4826 * median_of(v);
  };
  double med = 0, mad = 0;
  median_mad(wbegin, &med, &mad);
  bool shifted = false;  // the window restarted at a level shift
  // Level shift (an unannounced speed change, e.g. a new packing): the window restarts at the split
  // point where the steps after it sit well off those before (by kShiftSe standard errors of the
  // difference of their medians and 3 %), so the rate follows within ~window/4 steps and, as the
  // window grows back over the shift, keeps following it (a window half before and half after it
  // would average two levels). Each side holds at least a quarter window; split points are tried
  // every 1/10 of that.
  {
    const size_t ws = static_cast<size_t>(std::max<int64_t>(kMinWindow, window / 4));
    const size_t stride = std::max<size_t>(1, ws / 10);
    auto range_median = [&](size_t lo, size_t hi) {
      return median_of(std::vector<double>(rate.begin() + static_cast<std::ptrdiff_t>(lo),
                                           rate.begin() + static_cast<std::ptrdiff_t>(hi)));
    };
    size_t split = 0;
    double best = 0.0;
    for (size_t c = wbegin + ws; c + ws <= rate.size(); c += stride) {
      const double d = std::fabs(range_median(c, rate.size()) - range_median(wbegin, c));
      if (d > best) best = d, split = c;
    }
    if (split > 0) {
      double ms = 0, ds = 0;
      median_mad(split, &ms, &ds);
      const double before = range_median(wbegin, split);
      const double n1 = static_cast<double>(split - wbegin),
                   n2 = static_cast<double>(rate.size() - split);
      const double se = 1.25 * std::max(ds, 0.002 * ms) * std::sqrt(1 / n1 + 1 / n2);
      // ... and both halves of the steps after it sit off the steps before, the same way (speed
      // that wanders up and down for a while is no new level)
      const size_t half = split + (rate.size() - split) / 2;
      const double a1 = range_median(split, half) - before,
                   a2 = range_median(half, rate.size()) - before;
      const bool lasting = a1 * a2 > 0 && std::min(std::fabs(a1), std::fabs(a2)) > 0.5 * best;
      if (best > kShiftSe * se && best > 0.03 * ms && lasting) {
        wbegin = split;
        shifted = true;
        med = ms, mad = ds;
      }
    }
  }
  std::vector<double> wrates(rate.begin() + static_cast<std::ptrdiff_t>(wbegin), rate.end());
  const double clip_hi = med + kClipMads * std::max(mad, 0.01 * med);
  const double clip_lo = med - kClipMads * std::max(mad, 0.01 * med);
  // The base rate is the cost-weighted mean of the winsorized rates (seconds per cost unit over
  // the window's total cost): with variable-length batches a plain mean of per-step rates is
  // biased upward when a step also has a part that does not scale with its tokens.
  double base = 0.0, wcost = 0.0, sq = 0.0;
  for (size_t k = wbegin; k < rate.size(); ++k) {
    base += std::clamp(rate[k], clip_lo, clip_hi) * cost[k];
    wcost += cost[k];
  }
  base /= wcost;
  for (double x : wrates)
    sq += (std::clamp(x, clip_lo, clip_hi) - base) * (std::clamp(x, clip_lo, clip_hi) - base);
  // (Steps that took no measurable time, e.g. a trace rounded to 0.000 s, have no spread.)
  const double cv = wrates.size() > 1 && base > 0
                        ? std::sqrt(sq / static_cast<double>(wrates.size() - 1)) / base
                        : 0.0;

  // The span of steady steps (where a drift is looked for, unless the window holds a level
  // shift): since the warm-up, and within the schedule entry in force.
  size_t from = begin;
  // a config-announced change of seq_len or batch moves the rate per cost unit a little (the cost
  // model is not exact): the line starts at the entry now in force
  const int64_t entry_from = schedule_at(facts_, last_step).from_step;
  while (from < rate.size() && records_[normal[from]].step - 1 < entry_from) ++from;
  // Fill: observed tokens vs the schedule's tokens_per_step (variable-length batches).
  double fill = 0.0;
  for (size_t k = wbegin; k < rate.size(); ++k) {
    const auto& r = records_[normal[k]];
    fill += static_cast<double>(r.tokens) /
            static_cast<double>(schedule_at(facts_, r.step).tokens_per_step);
  }
  fill /= static_cast<double>(rate.size() - wbegin);

  // Extra cost of steps with events: ckpt / eval learned from their excess over the base rate,
  // from every one seen, those during the warm-up too (a short run may see its only ones there);
  // everything else after warm-up (spikes and epoch boundaries in full, above the base rate;
  // normal steps above max(clip, 1.5 × median, 1.5 × their block's level); the excess wait of a
  // recurring data-wait episode) feeds the unplanned-overhead rate.
  const size_t first_post_record = normal[begin];
  // Medians of consecutive blocks of kMinWindow normal steps, and each normal step's block.
  std::vector<double> block_median;
  std::vector<int64_t> block_of(records_.size(), -1);
  for (size_t k = 0; k < rate.size(); k += kMinWindow) {
    const size_t hi = std::min(rate.size(), k + kMinWindow);
    block_median.push_back(
        median_of(std::vector<double>(rate.begin() + static_cast<std::ptrdiff_t>(k),
                                      rate.begin() + static_cast<std::ptrdiff_t>(hi))));
    for (size_t j = k; j < hi; ++j)
      block_of[normal[j]] = static_cast<int64_t>(block_median.size() - 1);
  }
  // A block's level: the median of the medians of it and up to kLevelBlocks blocks on each side
  // (the lower middle of an even count, at the ends), so that a slow spell of up to six blocks is
  // no level of its own, but a longer run of blocks at another level (before a speed-up) is.
  std::vector<double> block_level(block_median.size());
  for (int64_t b = 0, n = static_cast<int64_t>(block_median.size()); b < n; ++b) {
    std::vector<double> m(block_median.begin() + std::max<int64_t>(0, b - kLevelBlocks),
                          block_median.begin() + std::min(n, b + kLevelBlocks + 1));
    const size_t mid = (m.size() - 1) / 2;
    std::nth_element(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(mid), m.end());
    block_level[static_cast<size_t>(b)] = m[mid];
  }
  double ckpt_sum = 0, eval_sum = 0, both_sum = 0, unplanned = 0, unplanned_max = 0;
  int unplanned_n = 0;
  int ckpt_n = 0, eval_n = 0, both_n = 0;
  int64_t post_steps = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    const auto& r = records_[i];
    if (r.tokens <= 0) continue;
    const bool ck = is_ckpt_event(r.event), ev = is_eval_event(r.event);
    // A warm-up step (the first, a compile, a resume) is no step of the rate, but a save or an
    // evaluation the runtime timed alone in it is one like any other: berth's evaluation before
    // the first step is the only one seen alone when every later one comes with a save.
    const bool warmup = is_warmup_event(r.event);
    const double overhead = event_overhead(r);
    if (warmup && overhead < 0) continue;
    if (i < first_post_record && !ck && !ev) continue;
    post_steps += !warmup && i >= first_post_record;
    const double c =
        step_cost(r.tokens, r.seq_len > 0 ? r.seq_len : schedule_at(facts_, r.step).seq_len, h);
    // An event step's cost over a normal step: its measured overhead where the runtime reports
    // one (the save or the evaluation timed alone), else its time above the base rate. With it
    // measured, the rest of the step is a step like any other, with whatever else its event
    // names (an epoch boundary's stall, an evaluation the runtime timed only in part): its noise
    // is no save time, and a stall in it is not lost.
    if (ck || ev) {
      const double excess = overhead >= 0 ? overhead : r.duration_s - base * c;
      if (ck && ev) {
        both_sum += excess, ++both_n;
      } else if (ck) {
        ckpt_sum += excess, ++ckpt_n;
      } else {
        eval_sum += excess, ++eval_n;
      }
      if (overhead < 0 || i < first_post_record || warmup) continue;
    }
    // a stall is > 1.5× the current median step and the level of its own block of steps: a
    // level that changed earlier (an unannounced speed-up) is not a stall (a step the runtime
    // labelled, e.g. a spike or an epoch boundary, counts in full, and so does an excess data
    // wait taken out of the rate above, unless it was a one-off)
    const double wait = wait_excess[i];
    const double level = std::max(
        {clip_hi, kStallFactor * med,
         block_of[i] >= 0 ? kStallFactor * block_level[static_cast<size_t>(block_of[i])] : 0.0});
    const bool labelled = !(ck || ev ? other_events(r.event) : r.event).empty();
    const double x =
        (wait_repeats[i] ? wait : 0.0) + std::max(0.0, r.duration_s - std::max(0.0, overhead) -
                                                           wait - (labelled ? base : level) * c);
    unplanned += x;
    unplanned_max = std::max(unplanned_max, x);
    unplanned_n += x > 0;
  }
  const double med_step = med * step_cost(schedule_at(facts_, last_step).tokens_per_step,
                                          schedule_at(facts_, last_step).seq_len, h);
  // Priors before the first: the runtime's own estimates where the facts carry them, else a
  // number of step times.
  const double ckpt_prior =
      facts_.ckpt_prior_s > 0 ? facts_.ckpt_prior_s : kCkptPriorSteps * med_step;
  const double eval_prior =
      (facts_.eval_prior_steps > 0 ? facts_.eval_prior_steps : kEvalPriorSteps) * med_step;
  double ckpt_cost = ckpt_n ? ckpt_sum / ckpt_n : ckpt_prior;
  double eval_cost = eval_n ? eval_sum / eval_n : eval_prior;
  if (both_n) {
    const double both = both_sum / both_n;
    if (ckpt_n && !eval_n)
      eval_cost = std::max(0.0, both - ckpt_cost);
    else if (!ckpt_n && eval_n)
      ckpt_cost = std::max(0.0, both - eval_cost);
    else if (!ckpt_n && !eval_n) {
      const double share = ckpt_prior / (ckpt_prior + eval_prior);
      ckpt_cost = share * both, eval_cost = (1.0 - share) * both;
    }
  }
  ckpt_cost = std::max(0.0, ckpt_cost);
  eval_cost = std::max(0.0, eval_cost);
  // One stall is not a rate: a single one is left out (it is already in elapsed).
  const double unplanned_rate = (unplanned - (unplanned_n <= 1 ? unplanned_max : 0.0)) /
                                (static_cast<double>(post_steps) + kExcessPriorSteps);

  // Slow drift (a rate that creeps, e.g. fragmentation or a warming straggler): a least-squares
  // line through the winsorized rates of every normal step since the warm-up (not while the window
  // holds a level shift). It is followed only when its slope is far outside its
  // standard error and both halves of that span slope the same way on their own: a single level
  // shift leaves one half flat, a periodic slowdown (late-epoch data waits) does not line up. The
  // extrapolated rate is capped at ±25 %.
  double slope = 0.0, center = static_cast<double>(last_step);
  {
    // OLS slope of the rate, clipped to [clip_a, clip_b], on the step
    auto fit = [&](size_t lo, size_t hi, double clip_a, double clip_b, double* se) {
      return ols_slope(
          lo, hi, [&](size_t k) { return static_cast<double>(records_[normal[k]].step); },
          [&](size_t k) { return std::clamp(rate[k], clip_a, clip_b); }, se);
    };
    // (not while the window holds a level shift: the span since it is too short for a line)
    if (rate.size() - from >= static_cast<size_t>(4 * kMinWindow) && !shifted) {
      const size_t mid = from + (rate.size() - from) / 2;
      double se = 0, se1 = 0, se2 = 0;
      const double sl = fit(from, rate.size(), clip_lo, clip_hi, &se);
      const double s1 = fit(from, mid, clip_lo, clip_hi, &se1);
      const double s2 = fit(mid, rate.size(), clip_lo, clip_hi, &se2);
      // ... and the two halves slope alike (a line, not the tail of a decaying warm-up transient,
      // whose first half falls much faster than its second: extrapolated as a line it would
      // predict a speed-up for the rest of the run). Compared on rates clipped above only at a
      // stall (1.5× the median): the window's clip would flatten the steep start of such a tail.
      // A drift that starts late (its second half steeper) is followed.
      double ue1 = 0, ue2 = 0;
      const double stall = std::max(clip_hi, kStallFactor * med);
      const double u1 = fit(from, mid, clip_lo, stall, &ue1);
      const double u2 = fit(mid, rate.size(), clip_lo, stall, &ue2);
      const bool alike = std::fabs(u2) >= kDriftHalfRatio * std::fabs(u1) ||
                         std::fabs(u1 - u2) <= 3.0 * std::hypot(ue1, ue2);
      if (std::fabs(sl) > kDriftT * se && s1 * sl > 0 && s2 * sl > 0 &&
          std::fabs(s1) > kDriftHalfT * se1 && std::fabs(s2) > kDriftHalfT * se2 && alike)
        slope = sl;
    }
    // the base (winsorized window mean) sits at the middle of its window
    center =
        0.5 * static_cast<double>(records_[normal[wbegin]].step + records_[normal.back()].step);
  }
  constexpr double kMaxDrift = 0.25;

  // Remaining normal time, step by step over the schedule.
  double rem_normal = 0.0;
  for (int64_t st = last_step + 1; st <= end_step; ++st) {
    const auto& e = schedule_at(facts_, st);
    const double r = std::clamp(base + slope * (static_cast<double>(st) - center),
                                (1 - kMaxDrift) * base, (1 + kMaxDrift) * base);
    rem_normal += r * fill * step_cost(e.tokens_per_step, e.seq_len, h);
  }
  const int64_t rem_steps = end_step - last_step;
  // Events among the remaining steps: multiples of the interval, the last step as the facts say.
  const int64_t rem_ckpt =
      events_between(last_step, end_step, facts_.ckpt_interval, facts_.final_ckpt);
  const int64_t rem_eval =
      events_between(last_step, end_step, facts_.eval_interval, facts_.final_eval);
  const double rem_events =
      static_cast<double>(rem_ckpt) * ckpt_cost + static_cast<double>(rem_eval) * eval_cost;
  // Data epochs: once a whole epoch has been seen (its end marked by an epoch event), its
  // per-step cost above the base rate (late-epoch data waits, the boundary stall, spikes;
  // checkpoints and evaluations are counted above) is taken to repeat at the same positions of
  // every later epoch. It then replaces the unplanned-overhead rate.
  double epoch_extra = 0.0;
  bool epoch_model = false;
  {
    std::vector<int64_t> bounds;
    for (const auto& r : records_)
      if (is_epoch_event(r.event)) bounds.push_back(r.step);
    int64_t prev = -1;
    if (bounds.size() >= 2) {
      prev = bounds[bounds.size() - 2];
    } else if (bounds.size() == 1 && facts_.start_step == 0) {
      prev = 0;
    }
    const int64_t len = prev >= 0 ? bounds.back() - prev : 0;
    if (len >= kMinWindow) {
      // The warm-up's steps, left out of the rate, are left out here too (a slow start is not a
      // cost of every epoch: they count as 0), but not the epoch's boundary step (its stall is).
      // Nothing of the epoch seen, and the unplanned-overhead rate stands instead.
      std::vector<double> profile(static_cast<size_t>(len), 0.0);
      int64_t seen = 0;
      for (size_t i = 0; i < records_.size(); ++i) {
        const auto& r = records_[i];
        if (r.step <= prev || r.step > bounds.back() || r.tokens <= 0) continue;
        if (i < first_post_record && !is_epoch_event(r.event)) continue;
        // A save or evaluation is counted above: a step with one measured is the rest of it,
        // with none measured it is left out.
        const double overhead = event_overhead(r);
        if (is_warmup_event(r.event) ||
            ((is_ckpt_event(r.event) || is_eval_event(r.event)) && overhead < 0))
          continue;
        const double c = step_cost(r.tokens, r.seq_len > 0 ? r.seq_len
                                                             : schedule_at(facts_, r.step).seq_len,
                                   h);
        // A one-off data wait (a cold cache that warmed) is no cost of every epoch either.
        const double one_off_wait = wait_repeats[i] ? 0.0 : wait_excess[i];
        profile[static_cast<size_t>(r.step - prev - 1)] =
            r.duration_s - std::max(0.0, overhead) - one_off_wait - base * c;
        ++seen;
      }
      if (seen > 0) {
        for (int64_t st = last_step + 1; st <= end_step; ++st) {
          epoch_extra += profile[static_cast<size_t>((st - bounds.back() - 1) % len)];
        }
        epoch_extra = std::max(0.0, epoch_extra);
        epoch_model = true;
      }
    }
  }
  const double rem = rem_normal + rem_events +
                     (epoch_model ? epoch_extra
                                  : unplanned_rate * static_cast<double>(rem_steps));

  out.remaining_s = rem;
  out.total_s = elapsed_s_ + rem;
  // Band: rate uncertainty (standard error of the window mean, plus a 2 % floor for drift the
  // window cannot see) on the normal part; event costs ±50 % while still a prior, once learned
  // from n events ±25 %/√n (at least ±5 %).
  const double rate_rel = 2.0 * cv / std::sqrt(static_cast<double>(wrates.size())) + 0.02;
  auto learned_rel = [](int n) {
    return n > 0 ? std::max(0.05, 0.25 / std::sqrt(static_cast<double>(n))) : 0.5;
  };
  const double ev_rel_ck = learned_rel(ckpt_n + both_n), ev_rel_e = learned_rel(eval_n + both_n);
  const double spread = rem_normal * rate_rel +
                        static_cast<double>(rem_ckpt) * ckpt_cost * ev_rel_ck +
                        static_cast<double>(rem_eval) * eval_cost * ev_rel_e +
                        (epoch_model ? 0.25 * epoch_extra
                                     : unplanned_rate * static_cast<double>(rem_steps));
  out.low_s = std::max(elapsed_s_, out.total_s - spread);
  out.high_s = out.total_s + spread;
  out.lease_exceeded = facts_.lease_s > 0 && out.total_s > facts_.lease_s;
  out.step_s = med_step;
  // Observed event time: combined steps split in the proportion of the two learned costs.
  const double ck_share = ckpt_cost + eval_cost > 0 ? ckpt_cost / (ckpt_cost + eval_cost) : 0.5;
  out.checkpoint_s = std::max(0.0, ckpt_sum + ck_share * both_sum) +
                     static_cast<double>(rem_ckpt) * ckpt_cost;
  out.eval_s = std::max(0.0, eval_sum + (1.0 - ck_share) * both_sum) +
               static_cast<double>(rem_eval) * eval_cost;
  out.checkpoints_observed = ckpt_n + both_n;
  out.ckpt_cost_s = ckpt_cost;
  out.eval_cost_s = eval_cost;
  return out;
}

// ---- baselines -------------------------------------------------------------------------------

double linear_total_s(const std::vector<StepRecord>& rows, int64_t session_steps) {
  BERTH_CHECK(!rows.empty(), "linear baseline needs at least one step");
  double elapsed = 0;
  for (const auto& r : rows) elapsed += r.duration_s;
  return elapsed / static_cast<double>(rows.size()) * static_cast<double>(session_steps);
}

double moving_average_total_s(const std::vector<StepRecord>& rows, int64_t session_steps,
                              double smoothing) {
  BERTH_CHECK(!rows.empty(), "moving-average baseline needs at least one step");
  double elapsed = 0, ema = rows.front().duration_s;
  for (size_t i = 0; i < rows.size(); ++i) {
    elapsed += rows[i].duration_s;
    if (i > 0) ema = smoothing * rows[i].duration_s + (1.0 - smoothing) * ema;
  }
  return elapsed + ema * static_cast<double>(session_steps - static_cast<int64_t>(rows.size()));
}

// ---- files -----------------------------------------------------------------------------------

std::vector<StepRecord> read_trace_csv(const std::string& path) {
  std::istringstream in(read_text_file(path));  // a missing file or a directory: named
  const std::string expected =
      "step,duration_s,tokens,seq_len,compute_s,comm_s,data_wait_s,overhead_s,mem_gib,event";
  std::string line;
  BERTH_CHECK(static_cast<bool>(std::getline(in, line)),
              "trace {} is empty: expected the header '{}'", path, expected);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  // A UTF-8 byte-order mark (a spreadsheet's export) is not part of the header; it read as
  // "header is 'step,…', expected 'step,…'", two lines that look the same.
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  BERTH_CHECK(line == expected, "trace {}: header is '{}', expected '{}'", path, line, expected);
  std::vector<StepRecord> rows;
  int64_t lineno = 1;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (!line.empty() && line.back() == ',') f.emplace_back();
    BERTH_CHECK(f.size() == 10, "trace {} line {}: {} fields, expected 10 ({})", path, lineno,
                f.size(), expected);
    StepRecord r;
    auto num = [&](size_t k, const char* name) {
      // strtod, not stod: stod refuses a value that underflows (a denormal such as 1e-320) as
      // out of range, like one that overflows. Decimal only: strtod also reads hexadecimal
      // ("0x10" as 16), "inf", "nan" and leading blanks, which no trace writer means.
      const char* begin = f[k].c_str();
      char* end = nullptr;
      const double v = std::strtod(begin, &end);
      if (f[k].empty() || f[k].find_first_not_of("0123456789.eE+-") != std::string::npos ||
          end != begin + f[k].size()) {
        BERTH_FAIL("trace {} line {}: {} '{}' is not a number", path, lineno, name, f[k]);
      }
      if (!std::isfinite(v)) {
        BERTH_FAIL("trace {} line {}: {} '{}' is not a finite number", path, lineno, name, f[k]);
      }
      return v;
    };
    // step, tokens and seq_len are whole numbers (>= 1, >= 0, >= 0; seq_len 0 = the schedule's)
    auto whole = [&](size_t k, const char* name, double least) {
      const double v = num(k, name);
      if (v != std::floor(v) || v < least || v > 9.0e15)
        BERTH_FAIL("trace {} line {}: {} '{}' must be a whole number >= {}", path, lineno, name,
                   f[k], least);
      return static_cast<int64_t>(v);
    };
    r.step = whole(0, "step", 1);
    r.duration_s = num(1, "duration_s");
    r.tokens = whole(2, "tokens", 0);
    r.seq_len = whole(3, "seq_len", 0);
    r.compute_s = num(4, "compute_s");
    r.comm_s = num(5, "comm_s");
    r.data_wait_s = num(6, "data_wait_s");
    r.overhead_s = num(7, "overhead_s");
    r.mem_gib = num(8, "mem_gib");
    // An event of spaces (or a CR left by a line ending) is no event: it counted as a named one.
    const size_t e0 = f[9].find_first_not_of(" \t\r"), e1 = f[9].find_last_not_of(" \t\r");
    r.event = e0 == std::string::npos ? std::string() : f[9].substr(e0, e1 - e0 + 1);
    if (r.event == "\"\"") r.event.clear();  // a CSV writer's quoted empty cell
    for (const auto& [name, v] : {std::pair{"duration_s", r.duration_s},
                                  {"compute_s", r.compute_s},
                                  {"comm_s", r.comm_s},
                                  {"data_wait_s", r.data_wait_s},
                                  {"overhead_s", r.overhead_s},
                                  {"mem_gib", r.mem_gib}}) {
      BERTH_CHECK(v >= 0, "trace {} line {}: {} {} is negative", path, lineno, name, v);
    }
    for (const double s : {r.duration_s, r.compute_s, r.comm_s, r.data_wait_s, r.overhead_s}) {
      BERTH_CHECK(std::fabs(s) <= kMaxStepSeconds,
                  "trace {} line {}: a time of {} s is beyond {:.0e} s (31 years): not a step's "
                  "time",
                  path, lineno, s, kMaxStepSeconds);
    }
    // One row per step of the session, in order: a gap would be read as no time spent.
    BERTH_CHECK(rows.empty() || r.step == rows.back().step + 1,
                "trace {} line {}: step {} after step {}: a trace has one row per step, in order "
                "(a row is missing, repeated or out of place)",
                path, lineno, r.step, rows.back().step);
    rows.push_back(std::move(r));
  }
  BERTH_CHECK(!rows.empty(), "trace {} has a header but no rows", path);
  return rows;
}

void check_trace_in_session(const std::vector<StepRecord>& rows, const RunFacts& facts,
                            const std::string& trace, const std::string& facts_where) {
  const int64_t first = facts.start_step + 1, last = facts.start_step + facts.session_steps;
  // A trace of a resumed session (steps 11..) against a fresh run's facts (start_step 0) gave a
  // prediction of 0.02 s.
  BERTH_CHECK(rows.empty() || rows.front().step == first,
              "trace {} begins at step {}, but the session {} describes begins at global step {} "
              "(start_step + 1); are they the trace and the run facts of one session?",
              trace, rows.front().step, facts_where, first);
  // Rows follow one another (read_trace_csv), so the last one tells whether any lies past it.
  BERTH_CHECK(rows.empty() || rows.back().step <= last,
              "trace {} has {} rows, more than the {} steps of the session {} describes (global "
              "steps {}..{}); are they the trace and the run facts of one session?",
              trace, rows.size(), facts.session_steps, facts_where, first, last);
}

namespace {

RunFacts facts_from_json(const nlohmann::json& j, const std::string& where) {
  BERTH_CHECK(j.is_object(), "{}: run facts must be a JSON object", where);
  RunFacts f;
  // (an unsigned number past int64 read back negative: max_steps 1e19 "exceeded" -8.4e18)
  auto in_int64 = [](const nlohmann::json& v) {
    return !v.is_number_unsigned() ||
           v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
  };
  auto need_int = [&](const char* key) -> int64_t {
    BERTH_CHECK(j.contains(key), "{}: run facts lack '{}'", where, key);
    BERTH_CHECK(j[key].is_number_integer(), "{}: '{}' must be an integer, got {}", where, key,
                j[key].dump());
    BERTH_CHECK(in_int64(j[key]), "{}: '{}' is {}, beyond any step count", where, key,
                j[key].dump());
    return j[key].get<int64_t>();
  };
  auto need_num = [&](const char* key) -> double {
    BERTH_CHECK(j.contains(key), "{}: run facts lack '{}'", where, key);
    BERTH_CHECK(j[key].is_number(), "{}: '{}' must be a number, got {}", where, key, j[key].dump());
    return j[key].get<double>();
  };
  f.max_steps = need_int("max_steps");
  f.start_step = need_int("start_step");
  f.session_steps = need_int("session_steps");
  f.ckpt_interval = need_int("ckpt_interval");
  f.eval_interval = need_int("eval_interval");
  f.hidden_size = need_int("hidden_size");
  f.mem_capacity_gib = need_num("mem_capacity_gib");
  f.lease_s = need_num("lease_s");
  if (j.contains("warmup_steps")) f.warmup_steps = need_int("warmup_steps");
  if (j.contains("ckpt_prior_s")) f.ckpt_prior_s = need_num("ckpt_prior_s");
  if (j.contains("eval_prior_steps")) f.eval_prior_steps = need_num("eval_prior_steps");
  for (auto [key, v] : {std::pair<const char*, double>{"ckpt_interval", double(f.ckpt_interval)},
                        {"eval_interval", double(f.eval_interval)},
                        {"mem_capacity_gib", f.mem_capacity_gib},
                        {"lease_s", f.lease_s},
                        {"ckpt_prior_s", f.ckpt_prior_s},
                        {"eval_prior_steps", f.eval_prior_steps}}) {
    BERTH_CHECK(std::isfinite(v) && v >= 0, "{}: '{}' must be >= 0 (0 = none), got {}", where, key,
                v);
  }
  for (auto [key, field] : {std::pair{"final_ckpt", &f.final_ckpt}, {"final_eval", &f.final_eval}}) {
    if (!j.contains(key)) continue;
    BERTH_CHECK(j[key].is_boolean(), "{}: '{}' must be true or false, got {}", where, key,
                j[key].dump());
    *field = j[key].get<bool>() ? 1 : 0;
  }
  BERTH_CHECK(f.warmup_steps >= 0, "{}: warmup_steps must be >= 0, got {}", where, f.warmup_steps);
  BERTH_CHECK(
      j.contains("schedule") && j["schedule"].is_array() && !j["schedule"].empty(),
      "{}: run facts need a non-empty 'schedule' list of [from_step, seq_len, tokens_per_step]",
      where);
  for (const auto& e : j["schedule"]) {
    BERTH_CHECK(e.is_array() && e.size() == 3 && e[0].is_number_integer() &&
                    e[1].is_number_integer() && e[2].is_number_integer(),
                "{}: schedule entry {} must be [from_step, seq_len, tokens_per_step] integers",
                where, e.dump());
    BERTH_CHECK(in_int64(e[0]) && in_int64(e[1]) && in_int64(e[2]),
                "{}: schedule entry {} has a value beyond any count", where, e.dump());
    f.schedule.push_back({e[0].get<int64_t>(), e[1].get<int64_t>(), e[2].get<int64_t>()});
    BERTH_CHECK(f.schedule.size() == 1 ||
                    f.schedule.back().from_step > f.schedule[f.schedule.size() - 2].from_step,
                "{}: schedule entries must be in increasing from_step order, each step once; "
                "{} follows from_step {}",
                where, e.dump(), f.schedule[f.schedule.size() - 2].from_step);
  }
  check_run_facts(f, where);
  // The steps before the first entry would have no seq_len or tokens_per_step of their own.
  BERTH_CHECK(f.schedule.front().from_step <= f.start_step + 1,
              "{}: the schedule's first entry is from step {}, after the session's first step {}: "
              "the config sets seq_len and tokens_per_step from the start (from_step 0)",
              where, f.schedule.front().from_step, f.start_step + 1);
  BERTH_CHECK(f.max_steps <= kMaxPredictedSteps,
              "{}: max_steps {} is beyond the {} steps the predictor forecasts (step by step)",
              where, f.max_steps, kMaxPredictedSteps);
  BERTH_CHECK(f.start_step <= f.max_steps - f.session_steps,
              "{}: start_step {} + session_steps {} exceeds max_steps {} (the run's total steps)",
              where, f.start_step, f.session_steps, f.max_steps);
  return f;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // syntax, or a number beyond a double
    BERTH_FAIL("{}: invalid JSON ({})", where, e.what());
  }
}

}  // namespace

std::string trace_csv_header() {
  return "step,duration_s,tokens,seq_len,compute_s,comm_s,data_wait_s,overhead_s,mem_gib,event\n";
}

std::string trace_csv_row(const StepRecord& r) {
  BERTH_CHECK(r.event.find_first_of(",\n\r") == std::string::npos,
              "trace event '{}' must not contain a comma or a line break", r.event);
  return fmt::format("{},{:.6f},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.4f},{}\n", r.step,
                     r.duration_s, r.tokens, r.seq_len, r.compute_s, r.comm_s, r.data_wait_s,
                     r.overhead_s, r.mem_gib, r.event);
}

std::string run_facts_to_json(const RunFacts& f) {
  nlohmann::json sched = nlohmann::json::array();
  for (const auto& e : f.schedule) sched.push_back({e.from_step, e.seq_len, e.tokens_per_step});
  nlohmann::json j = {{"max_steps", f.max_steps},
                            {"start_step", f.start_step},
                            {"session_steps", f.session_steps},
                            {"ckpt_interval", f.ckpt_interval},
                            {"eval_interval", f.eval_interval},
                            {"schedule", sched},
                            {"hidden_size", f.hidden_size},
                            {"mem_capacity_gib", f.mem_capacity_gib},
                            {"lease_s", f.lease_s},
                            {"warmup_steps", f.warmup_steps}};
  if (f.ckpt_prior_s > 0) j["ckpt_prior_s"] = f.ckpt_prior_s;
  if (f.eval_prior_steps > 0) j["eval_prior_steps"] = f.eval_prior_steps;
  if (f.final_ckpt >= 0) j["final_ckpt"] = f.final_ckpt == 1;
  if (f.final_eval >= 0) j["final_eval"] = f.final_eval == 1;
  return j.dump(2) + "\n";
}

RunFacts read_run_facts_json(const std::string& path_or_json) {
  const size_t p = path_or_json.find_first_not_of(" \t\r\n");
  const bool inline_json = p != std::string::npos && path_or_json[p] == '{';
  const std::string where = inline_json ? std::string("run facts") : path_or_json;
  const auto j = parse_json_text(inline_json ? path_or_json : read_text_file(path_or_json), where);
  return facts_from_json(j, where);
}

// ---- bench -----------------------------------------------------------------------------------

std::vector<EtaBenchRow> run_eta_bench(const std::string& dir) {
  const std::string index_path = (std::filesystem::path(dir) / "index.json").string();
  const auto index = parse_json_text(read_text_file(index_path), index_path);
  BERTH_CHECK(index.is_array() && !index.empty(), "{}: expected a non-empty list of runs",
              index_path);
  const std::vector<double> ps = {0.05, 0.10, 0.25, 0.50, 0.75};
  const std::vector<double> offsets = {-0.005, -0.0025, 0.0, 0.0025, 0.005};
  struct Acc {
    std::vector<double> b, l, m, br, lr, mr;
    int agree_b = 0, agree_l = 0, agree_m = 0, n = 0, leased = 0;
  };
  std::vector<Acc> acc(ps.size());
  for (size_t t = 0; t < index.size(); ++t) {
    const auto& j = index[t];
    BERTH_CHECK(j.is_object() && j.contains("file"), "{} entry {}: lacks 'file'", index_path, t);
    BERTH_CHECK(j["file"].is_string(), "{} entry {}: 'file' must be a file name, got {}",
                index_path, t, j["file"].dump());
    const std::string where = fmt::format("{} entry {} ({})", index_path, t, j["file"].dump());
    BERTH_CHECK(j.contains("true_total_s"), "{}: lacks 'true_total_s'", where);
    BERTH_CHECK(j["true_total_s"].is_number(), "{}: 'true_total_s' must be a number, got {}", where,
                j["true_total_s"].dump());
    const RunFacts facts = facts_from_json(j, where);
    const double truth = j["true_total_s"].get<double>();
    BERTH_CHECK(truth > 0, "{}: true_total_s must be > 0, got {}", where, truth);
    const auto rows =
        read_trace_csv((std::filesystem::path(dir) / j["file"].get<std::string>()).string());
    BERTH_CHECK(static_cast<int64_t>(rows.size()) == facts.session_steps,
                "{}: trace has {} rows, session_steps is {}", where, rows.size(),
                facts.session_steps);
    check_trace_in_session(rows, facts, j["file"].get<std::string>(), where);
    // The queries lie between the first and the last step: a one-step session has none.
    BERTH_CHECK(facts.session_steps >= 2,
                "{}: a session of {} step leaves nothing to predict (the queries lie between its "
                "first and last step); leave it out of the index",
                where, facts.session_steps);
    double traced_s = 0;
    for (const StepRecord& r : rows) traced_s += r.duration_s;
    // Below its own steps' time, an error would come out negative (0.1 %: the index's total and
    // the trace's rows are rounded apart).
    BERTH_CHECK(truth >= traced_s * (1 - 1e-3),
                "{}: true_total_s {:.3f} is less than the {:.3f} s the steps of {} took: the index "
                "and the trace disagree",
                where, truth, traced_s, j["file"].get<std::string>());
    ProgressPredictor pred(facts);
    size_t fed = 0;
    std::vector<StepRecord> prefix;
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      for (double off : offsets) {
        const auto q = static_cast<size_t>(std::clamp<int64_t>(
            std::llround((ps[pi] + off) * static_cast<double>(facts.session_steps)), 1,
            facts.session_steps - 1));
        while (fed < q) {
          pred.observe(rows[fed]);
          prefix.push_back(rows[fed]);
          ++fed;
        }
        const double elapsed = pred.elapsed_s();
        const double b = pred.predict().total_s, l = linear_total_s(prefix, facts.session_steps),
                     m = moving_average_total_s(prefix, facts.session_steps);
        auto& a = acc[pi];
        a.b.push_back(std::fabs(b - truth) / truth);
        a.l.push_back(std::fabs(l - truth) / truth);
        a.m.push_back(std::fabs(m - truth) / truth);
        // (none remains after steps of no time, which the reader takes: no error, not inf)
        if (const double rt = truth - elapsed; rt > 0) {
          a.br.push_back(std::fabs(b - truth) / rt);
          a.lr.push_back(std::fabs(l - truth) / rt);
          a.mr.push_back(std::fabs(m - truth) / rt);
        }
        // A run without a lease (lease_s 0) has no flag to agree on: every method "agreed".
        if (facts.lease_s > 0) {
          const bool over = truth > facts.lease_s;
          a.agree_b += (b > facts.lease_s) == over;
          a.agree_l += (l > facts.lease_s) == over;
          a.agree_m += (m > facts.lease_s) == over;
          ++a.leased;
        }
        ++a.n;
      }
    }
  }
  auto mean = [](const std::vector<double>& v) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  std::vector<EtaBenchRow> out;
  for (size_t pi = 0; pi < ps.size(); ++pi) {
    const auto& a = acc[pi];
    EtaBenchRow r;
    r.p = ps[pi];
    r.n = a.n;
    r.berth_mape = mean(a.b), r.berth_p90 = quantile_of(a.b, 0.9), r.berth_worst = worst(a.b);
    r.linear_mape = mean(a.l), r.linear_p90 = quantile_of(a.l, 0.9), r.linear_worst = worst(a.l);
    r.ma_mape = mean(a.m), r.ma_p90 = quantile_of(a.m, 0.9), r.ma_worst = worst(a.m);
    r.berth_rem_mape = mean(a.br), r.linear_rem_mape = mean(a.lr), r.ma_rem_mape = mean(a.mr);
    r.leased = a.leased;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    r.berth_lease_agree = a.leased ? static_cast<double>(a.agree_b) / a.leased : nan;
    r.linear_lease_agree = a.leased ? static_cast<double>(a.agree_l) / a.leased : nan;
    r.ma_lease_agree = a.leased ? static_cast<double>(a.agree_m) / a.leased : nan;
    out.push_back(r);
  }
  return out;
}

}  // namespace berth
