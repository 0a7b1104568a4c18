// The live progress monitor on synthetic per-rank records: each warning fires on the phenomenon it
// names and stays quiet without it; the block's format; wall-clock parsing and durations; the
// trace and run-facts writers read back by the readers `berth eta replay` uses.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/cluster/progress_monitor.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

constexpr int64_t kSteps = 1000;

RunFacts facts(int64_t ckpt_interval = 0) {
  RunFacts f;
  f.max_steps = kSteps;
  f.session_steps = kSteps;
  f.ckpt_interval = ckpt_interval;
  f.schedule = {{0, 128, 4096}};
  f.hidden_size = 256;
  f.mem_capacity_gib = 4.0;
  f.warmup_steps = 5;
  return f;
}

MonitorSettings settings(int ranks) {
  MonitorSettings s;
  for (int r = 0; r < ranks; ++r) s.rank_names.push_back(std::to_string(r) + "@node" + char('A' + r));
  s.flops_per_token = 6e6;
  s.session_start_unix = parse_utc_time("2026-12-02T12:00:00Z");
  return s;
}

// A balanced step: every rank computes 90 ms (±1 %, deterministic), communicates 10 ms.
std::vector<RankStepMetrics> balanced(int ranks, int64_t step) {
  std::vector<RankStepMetrics> v(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    RankStepMetrics& m = v[size_t(r)];
    m.compute_s = 0.090 * (1.0 + 0.01 * std::sin(double(step * 7 + r * 13)));
    m.comm_s = 0.010;
    m.wall_s = 0.100;
    m.tokens = 4096.0 / ranks;
    m.mem_gib = 1.0;
    m.mem_peak_gib = 1.2;
  }
  return v;
}

bool has(const ProgressReport& r, WarningKind k, std::string* msg = nullptr) {
  for (const ProgressWarning& w : r.warnings) {
    if (w.kind == k) {
      if (msg) *msg = w.message;
      return true;
    }
  }
  return false;
}

// Feeds steps 1..n made by `make(step)`.
template <typename F>
ProgressMonitor run(int ranks, int64_t n, F make, RunFacts f = facts(),
                    MonitorSettings s = MonitorSettings()) {
  if (s.rank_names.empty()) s = settings(ranks);
  ProgressMonitor m(f, s);
  for (int64_t step = 1; step <= n; ++step) {
    std::vector<RankStepMetrics> v = make(step);
    m.observe(step, v, 4096, 128, step == 1 ? "first_step" : "");
  }
  return m;
}

// Feeds balanced 2-rank steps 1..n to `m`, every `every`-th also saving a checkpoint that adds
// `save_s` to each rank's wall time as overhead.
void feed_with_saves(ProgressMonitor& m, int64_t n, int64_t every, double save_s) {
  for (int64_t step = 1; step <= n; ++step) {
    auto v = balanced(2, step);
    const bool ck = step % every == 0;
    if (ck) {
      for (auto& x : v) x.wall_s += save_s, x.overhead_s = save_s;
    }
    m.observe(step, v, 4096, 128, step == 1 ? "first_step" : ck ? "ckpt" : "");
  }
}

TEST(ProgressMonitor, BalancedRunRaisesNothing) {
  const ProgressReport r = run(4, 100, [](int64_t s) { return balanced(4, s); }).report();
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front().message;
  EXPECT_NEAR(r.tokens_per_s, 40960, 1);
  EXPECT_NEAR(r.prediction.total_s, 100.0, 1.0);  // 1000 steps of 0.1 s
  EXPECT_DOUBLE_EQ(r.peak_mem_gib, 1.2);
}

TEST(ProgressMonitor, StragglerNamedWithHostAndMargin) {
  // Rank 2 computes 30 % longer; the others wait for it in communication.
  const ProgressReport r = run(4, 100, [](int64_t s) {
                             auto v = balanced(4, s);
                             v[2].compute_s *= 1.3;
                             for (int k : {0, 1, 3}) v[size_t(k)].comm_s += 0.027;
                             for (auto& m : v) m.wall_s = 0.127;
                             return v;
                           }).report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Straggler, &msg));
  EXPECT_NE(msg.find("rank 2@nodeC"), std::string::npos) << msg;
  EXPECT_NE(msg.find("30% longer"), std::string::npos) << msg;
  // The waiting is explained by the straggler: no communication-bound warning on top of it.
  EXPECT_FALSE(has(r, WarningKind::CommBound));
}

TEST(ProgressMonitor, PipelineStagesAreComparedOnlyWithThemselves) {
  // pp = 2 over 4 ranks (stages 0, 0, 1, 1): the last stage also runs the LM head and the loss,
  // 20 % more work on both of its ranks. That is no straggler; a rank 30 % slower than the other
  // rank of its own stage is.
  MonitorSettings s = settings(4);
  s.rank_stage = {0, 0, 1, 1};
  auto stages = [](double rank3) {
    return [rank3](int64_t st) {
      auto v = balanced(4, st);
      v[2].compute_s *= 1.2, v[3].compute_s *= 1.2 * rank3;
      for (auto& m : v) m.wall_s = m.compute_s + m.comm_s;
      return v;
    };
  };
  // rank 3 5 % slower than rank 2 (noise of a real run): below the margin within its stage
  EXPECT_FALSE(has(run(4, 100, stages(1.05), facts(), s).report(), WarningKind::Straggler));
  // without the stages the imbalance reads as a straggler (what the stage grouping prevents)
  EXPECT_TRUE(has(run(4, 100, stages(1.05)).report(), WarningKind::Straggler));
  std::string msg;
  ASSERT_TRUE(has(run(4, 100, stages(1.3), facts(), s).report(), WarningKind::Straggler, &msg));
  EXPECT_NE(msg.find("rank 3@nodeD is busy 30% longer per step than the median of the other "
                     "ranks of its pipeline stage"),
            std::string::npos)
      << msg;
}

TEST(ProgressMonitor, ASlowSpellThatMovesToAnotherRankIsNotAStraggler) {
  // Noise on a shared machine: rank 0 is 30 % slower for 50 steps, then rank 1 for 50. Each spell
  // alone fills a window of 50 steps, but neither rank is consistently slower.
  auto spells = [](int64_t rank1_from) {
    return [rank1_from](int64_t s) {
      auto v = balanced(4, s);
      v[s < rank1_from ? 0 : 1].compute_s *= 1.3;
      for (auto& m : v) m.wall_s = m.compute_s + m.comm_s;
      return v;
    };
  };
  // warm-up ends at step 5: steps 6..55 rank 0, 56..105 rank 1
  EXPECT_FALSE(has(run(4, 105, spells(56)).report(), WarningKind::Straggler));
  // rank 1 stays slower for 50 more steps: both halves of the last 100 name it
  std::string msg;
  ASSERT_TRUE(has(run(4, 155, spells(56)).report(), WarningKind::Straggler, &msg));
  EXPECT_NE(msg.find("rank 1@nodeB is busy 30% longer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("means over the last 100 steps, slowest in 100 of them and in both halves"),
            std::string::npos)
      << msg;
  // A spell 50 % slower, the others waiting for it in communication (30 % of step time): the
  // waiting is the imbalance, so no communication-bound warning either.
  const ProgressReport waiting = run(4, 105, [](int64_t s) {
                                   auto v = balanced(4, s);
                                   const size_t slow = s < 56 ? 0 : 1;
                                   v[slow].compute_s *= 1.5;
                                   const double wall = v[slow].compute_s + v[slow].comm_s;
                                   for (auto& m : v) m.comm_s += wall - m.compute_s - m.comm_s;
                                   for (auto& m : v) m.wall_s = wall;
                                   return v;
                                 }).report();
  EXPECT_FALSE(has(waiting, WarningKind::Straggler));
  EXPECT_FALSE(has(waiting, WarningKind::CommBound)) << waiting.warnings.front().message;
}

TEST(ProgressMonitor, AReportOnFourThousandRanksStaysCheap) {
  // Rank 0 computes the report between steps, so its cost is every rank's. The straggler test
  // compares each rank with the median of the others of its stage, step by step: done naively
  // that is O(ranks^2) per step, 42 s per report at 4096 ranks (measured on the 2-core dev VM);
  // one sort per stage and step takes 0.15 s there. The bound leaves room for a loaded machine.
  constexpr int kRanks = 4096;
  MonitorSettings s = settings(kRanks);
  for (int r = 0; r < kRanks; ++r) s.rank_stage.push_back(r % 4);
  const ProgressMonitor m = run(
      kRanks, 110,
      [](int64_t st) {
        auto v = balanced(kRanks, st);
        v[77].compute_s *= 1.3;
        for (auto& x : v) x.wall_s = x.compute_s + x.comm_s;
        return v;
      },
      facts(), s);
  const auto t0 = std::chrono::steady_clock::now();
  const ProgressReport r = m.report();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Straggler, &msg));
  EXPECT_NE(msg.find("rank 77@"), std::string::npos) << msg;
  EXPECT_LT(took, 5.0);
}

TEST(ProgressMonitor, OccasionalSlowRankIsNotAStraggler) {
  // Every rank is slow now and then (a different one each step): nobody is consistently slowest.
  const ProgressReport r = run(4, 100, [](int64_t s) {
                             auto v = balanced(4, s);
                             v[size_t(s % 4)].compute_s *= 1.3;
                             return v;
                           }).report();
  EXPECT_FALSE(has(r, WarningKind::Straggler));
}

TEST(ProgressMonitor, DataLoadingBound) {
  const ProgressReport quiet = run(2, 60, [](int64_t s) {
                                 auto v = balanced(2, s);
                                 for (auto& m : v) m.data_wait_s = 0.005;  // 5 %
                                 return v;
                               }).report();
  EXPECT_FALSE(has(quiet, WarningKind::DataBound));
  const ProgressReport r = run(2, 60, [](int64_t s) {
                             auto v = balanced(2, s);
                             v[0].data_wait_s = 0.015;
                             v[1].data_wait_s = 0.030;  // 30 % on rank 1
                             return v;
                           }).report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::DataBound, &msg));
  EXPECT_NE(msg.find("worst 1@nodeB: 30%"), std::string::npos) << msg;
}

TEST(ProgressMonitor, CommunicationBound) {
  const ProgressReport r = run(4, 60, [](int64_t s) {
                             auto v = balanced(4, s);
                             for (auto& m : v) m.comm_s = 0.045, m.wall_s = 0.135;  // 33 %
                             return v;
                           }).report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::CommBound, &msg));
  EXPECT_NE(msg.find("33%"), std::string::npos) << msg;
}

TEST(ProgressMonitor, MemoryTrendPassingCapacity) {
  // 1 GiB growing 4 MiB per step: after step 100 it reaches 4 GiB (capacity) near step 870.
  auto leak = [](int64_t s) {
    auto v = balanced(2, s);
    v[1].mem_gib = 1.0 + 4.0 / 1024 * double(s);
    return v;
  };
  const ProgressReport r = run(2, 100, leak).report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Memory, &msg));
  EXPECT_NE(msg.find("rank 1@nodeB grows 4.0 MiB per step"), std::string::npos) << msg;
  const int64_t expect = 100 + int64_t(std::ceil((4.0 - (1.0 + 400.0 / 1024)) / (4.0 / 1024)));
  EXPECT_NE(msg.find("at step " + std::to_string(expect) + " of 1000"), std::string::npos) << msg;
  // The same growth with room to spare: no warning.
  RunFacts roomy = facts();
  roomy.mem_capacity_gib = 8.0;
  EXPECT_FALSE(has(run(2, 100, leak, roomy).report(), WarningKind::Memory));
  // Already above capacity: since about when, not a step still to come.
  RunFacts tight = facts();
  tight.mem_capacity_gib = 1.2;  // passed near step 52
  ASSERT_TRUE(has(run(2, 100, leak, tight).report(), WarningKind::Memory, &msg));
  EXPECT_NE(msg.find("it is above the 1.20 GiB capacity, since about step 52"), std::string::npos)
      << msg;
  // Flat memory with noise: no warning.
  EXPECT_FALSE(has(run(2, 100,
                       [](int64_t s) {
                         auto v = balanced(2, s);
                         v[0].mem_gib = 3.9 + 0.05 * std::sin(double(s));
                         return v;
                       })
                       .report(),
                   WarningKind::Memory));
}

TEST(ProgressMonitor, WindowEndsBeforeFinishWithExtendCommand) {
  RunFacts f = facts();
  MonitorSettings s = settings(2);
  s.reservation = "R-12";
  // The run needs ~100 s; the window gives it 80 s.
  s.window_end_unix = s.session_start_unix + 80;
  f.lease_s = 80;
  const ProgressReport r = run(2, 200, [](int64_t st) { return balanced(2, st); }, f, s).report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Window, &msg));
  EXPECT_NE(msg.find("ends at 2026-12-02T12:01:20Z"), std::string::npos) << msg;  // to the second
  EXPECT_NE(msg.find("20s before the predicted finish"), std::string::npos) << msg;
  EXPECT_NE(msg.find("`berth extend R-12 --by 15m`"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower train.steps to about 800"), std::string::npos) << msg;
  s.window_end_unix = s.session_start_unix + 200;
  f.lease_s = 200;
  EXPECT_FALSE(
      has(run(2, 200, [](int64_t st) { return balanced(2, st); }, f, s).report(),
          WarningKind::Window));
}

TEST(ProgressMonitor, AWindowWithoutABookingAdvisesNoBerthExtend) {
  // progress.window_end without --reservation (the job's allocation ends then): there is no
  // booking to extend, and the advice named `berth extend <reservation>`.
  RunFacts f = facts();
  MonitorSettings s = settings(2);
  s.window_end_unix = s.session_start_unix + 80;
  const ProgressReport r = run(
                               2, 200, [](int64_t st) { return balanced(2, st); }, f, s)
                               .report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Window, &msg));
  EXPECT_EQ(msg.find("berth extend"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Lower train.steps to about 800, or get the job a window 15m longer (and "
                     "move progress.window_end with it)"),
            std::string::npos)
      << msg;
  // A window long past: the finish and its band, seconds apart, are told apart to the second
  // (at minutes they printed as "band 12:20–12:20").
  s.window_end_unix = s.session_start_unix - 3600;
  const ProgressReport late = run(
                                  2, 200, [](int64_t st) { return balanced(2, st); }, f, s)
                                  .report();
  ASSERT_TRUE(has(late, WarningKind::Window, &msg));
  EXPECT_NE(msg.find("band 2026-12-02T12:01:"), std::string::npos) << msg;
}

// 200 balanced steps of ~0.1 s (a ~100 s run) under reservation R-12, whose window ends
// `window_s` after the session's start.
ProgressMonitor booked(double window_s, int final_ckpt = -1) {
  RunFacts f = facts();
  f.lease_s = window_s;
  f.final_ckpt = final_ckpt;
  MonitorSettings s = settings(2);
  s.reservation = "R-12";
  s.window_end_unix = s.session_start_unix + window_s;
  ProgressMonitor m(f, s);
  for (int64_t step = 1; step <= 200; ++step) m.observe(step, balanced(2, step), 4096, 128, "");
  return m;
}

TEST(ProgressMonitor, ALeasedRunsWindowWarningCountsItsStopReserve) {
  // A leased run stops its reserve (1.5 × checkpoint + margin) before the window's end: a window
  // of 120 s for a ~100 s run raised nothing, and the run stopped short at 90 s.
  ProgressMonitor m = booked(120);
  const double start = settings(2).session_start_unix;
  EXPECT_FALSE(has(m.report(), WarningKind::Window));
  m.set_window_end(start + 120, false, 30);
  std::string msg;
  ASSERT_TRUE(has(m.report(), WarningKind::Window, &msg));
  EXPECT_NE(msg.find("the run must stop by 2026-12-02T12:01:30Z (30s before the booked window "
                     "ends at 2026-12-02T12:02:00Z, to save its checkpoint), 10s before the "
                     "predicted end of its steps"),
            std::string::npos)
      << msg;
  // The advice fits the stop point: 70 s left at 0.1 s a step after step 200.
  EXPECT_NE(msg.find("lower train.steps to about 900"), std::string::npos) << msg;
  EXPECT_EQ(m.predictor().facts().lease_s, 120);  // the trace's facts keep the booked window
  // The save after the last step lies in the reserve (it is what the reserve holds): a run whose
  // steps end by the stop point is not warned of, though its predicted finish, with that save
  // (here the prior, 100 step times), is later. It was, and then finished with exit 0.
  ProgressMonitor saves = booked(120, 1);
  saves.set_window_end(start + 120, false, 15);
  EXPECT_GT(saves.report().prediction.total_s, 105);
  EXPECT_FALSE(has(saves.report(), WarningKind::Window));
  saves.set_window_end(start + 120, false, 30);  // its steps end 10 s after the stop point
  ASSERT_TRUE(has(saves.report(), WarningKind::Window, &msg));
  EXPECT_NE(msg.find("10s before the predicted end of its steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower train.steps to about 900"), std::string::npos) << msg;
}

TEST(ProgressMonitor, AnExtendedWindowEndsTheWarningACutOneRaisesIt) {
  // The lease is extended mid-run (`berth extend`): the warning, the lease flag and the facts
  // follow the new window from the next report; a window cut short (preemption) raises them.
  ProgressMonitor m = booked(80);
  const MonitorSettings s = settings(2);
  ProgressReport r = m.report();
  ASSERT_TRUE(has(r, WarningKind::Window));
  EXPECT_TRUE(r.prediction.lease_exceeded);
  EXPECT_EQ(m.due(r).size(), 1u);

  m.set_window_end(s.session_start_unix + 200);
  r = m.report();
  EXPECT_FALSE(has(r, WarningKind::Window));
  EXPECT_FALSE(r.prediction.lease_exceeded);
  EXPECT_TRUE(m.due(r).empty());
  EXPECT_EQ(m.predictor().facts().lease_s, 200);

  m.set_window_end(s.session_start_unix + 90, true);  // preempted: 10 s less than it needs
  r = m.report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Window, &msg));
  EXPECT_TRUE(r.prediction.lease_exceeded);
  EXPECT_NE(msg.find("10s before the predicted finish"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ends at 2026-12-02T12:01:30Z"), std::string::npos) << msg;
  // The preemptor holds the devices after the cut: extending cannot help, resuming elsewhere can.
  EXPECT_EQ(msg.find("berth extend"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cut short by a preemption and cannot be extended"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume auto, or lower train.steps to about"), std::string::npos) << msg;
  ASSERT_EQ(m.due(r).size(), 1u);  // a warning that returns is logged at once

  m.set_window_end(s.session_start_unix - 3600);  // already over: still a window, overrun
  EXPECT_GT(m.predictor().facts().lease_s, 0);
  r = m.report();
  EXPECT_TRUE(r.prediction.lease_exceeded);
  ASSERT_TRUE(has(r, WarningKind::Window, &msg));  // an hour apart: to the minute
  EXPECT_NE(msg.find("ends at 2026-12-02 11:00 UTC, 1h01m before"), std::string::npos) << msg;
}

TEST(ProgressMonitor, CheckpointOverhead) {
  // A checkpoint every 10 steps costs 3 s on top of a 0.1 s step: ~75 % of the run.
  for (double cost : {3.0, 0.01}) {
    ProgressMonitor m(facts(10), settings(2));
    feed_with_saves(m, 100, 10, cost);
    const ProgressReport r = m.report();
    std::string msg;
    EXPECT_EQ(has(r, WarningKind::Checkpoints, &msg), cost > 1.0) << cost;
    if (cost > 1.0) {
      EXPECT_NEAR(r.prediction.checkpoint_s, 100 * cost, 0.05 * 100 * cost);
      EXPECT_NE(msg.find("checkpoint.interval from 10 to about"), std::string::npos) << msg;
    }
  }
}

TEST(ProgressMonitor, CheckpointTimeIsTheMeasuredSaveNotTheStepsNoise) {
  // Saves of 0.1 s every 20 steps, but each saving step also computes 1 s longer (a slow step on
  // a busy machine): the step's excess over the rate is no save time. Taken for it, the block
  // showed ~10x the save time and warned to set checkpoint.interval = 0.
  ProgressMonitor m(facts(20), settings(2));
  for (int64_t step = 1; step <= 200; ++step) {
    auto v = balanced(2, step);
    const bool ck = step % 20 == 0;
    if (ck) {
      for (auto& x : v) x.compute_s += 1.0, x.overhead_s = 0.1, x.wall_s += 1.1;
    }
    m.observe(step, v, 4096, 128, step == 1 ? "first_step" : ck ? "ckpt" : "");
  }
  const ProgressReport r = m.report();
  EXPECT_NEAR(r.prediction.checkpoint_s, 50 * 0.1, 0.01);  // 10 seen, 40 to come
  EXPECT_FALSE(has(r, WarningKind::Checkpoints));
}

TEST(ProgressMonitor, NoCheckpointWarningWhenTheOnlySaveIsTheLastSteps) {
  // 12 steps with checkpoint.interval 40 and a final save of 1 s, an eighth of the run: setting
  // checkpoint.interval = 0, as the warning said, saved the same.
  RunFacts f = facts(40);
  f.max_steps = f.session_steps = 12;
  f.final_ckpt = 1;
  ProgressMonitor m(f, settings(2));
  for (int64_t step = 1; step <= 12; ++step) {
    auto v = balanced(2, step);
    if (step == 12) {
      for (auto& x : v) x.overhead_s = 1.0, x.wall_s += 1.0;
    }
    m.observe(step, v, 4096, 128, step == 1 ? "first_step" : step == 12 ? "ckpt" : "");
  }
  const ProgressReport r = m.report();
  EXPECT_EQ(r.prediction.checkpoints_observed, 1);
  EXPECT_FALSE(has(r, WarningKind::Checkpoints)) << r.warnings.front().message;
}

TEST(ProgressMonitor, AStopsSaveIsBookedIntoTheLastStep) {
  // A stop (signal, window's end) saves after the step's record: amended into it, the session's
  // elapsed time counts the save and the row reads ckpt, as a periodic save's does.
  ProgressMonitor m(facts(0), settings(2));
  feed_with_saves(m, 60, 1000, 0);
  const double before = m.predictor().elapsed_s();
  const StepRecord& r = m.amend_last(2.5, "ckpt");
  EXPECT_EQ(r.step, 60);
  EXPECT_EQ(r.event, "ckpt");
  EXPECT_NEAR(r.duration_s, 0.1 + 2.5, 1e-9);
  EXPECT_NEAR(r.overhead_s, 2.5, 1e-9);
  EXPECT_NEAR(m.predictor().elapsed_s(), before + 2.5, 1e-9);
  const ProgressReport rep = m.report();
  EXPECT_NEAR(rep.prediction.checkpoint_s, 2.5, 0.01) << "the save is the run's one checkpoint";
  EXPECT_NEAR(rep.tokens_per_s, 4096 / 0.1, 4096 / 0.1 * 0.02) << "not training time";
}

TEST(ProgressMonitor, EveryStepSavingOrEvaluatingStillWarns) {
  // checkpoint.interval = 1: every step saves (0.3 s over a 0.1 s step) and waits 30 ms for data.
  // No step was free of events, so no warning could fire, and the block showed no checkpoints.
  ProgressMonitor m(facts(1), settings(2));
  for (int64_t step = 1; step <= 100; ++step) {
    auto v = balanced(2, step);
    for (auto& x : v) x.data_wait_s = 0.03, x.wall_s += 0.3, x.overhead_s = 0.3;
    m.observe(step, v, 4096, 128, step == 1 ? "first_step+ckpt" : "ckpt");
  }
  const ProgressReport r = m.report();
  std::string msg;
  ASSERT_TRUE(has(r, WarningKind::Checkpoints, &msg));
  EXPECT_NE(msg.find("(75%)"), std::string::npos) << msg;
  // 3 % of the time: an interval of 0.75 / 0.03 = 25, whose ceiling is 26 when the share is a
  // hair above 75 % (step 1's save counts: it was timed alone)
  EXPECT_TRUE(msg.find("checkpoint.interval from 1 to about 25 ") != std::string::npos ||
              msg.find("checkpoint.interval from 1 to about 26 ") != std::string::npos)
      << msg;
  ASSERT_TRUE(has(r, WarningKind::DataBound, &msg));  // 30 ms of a 100 ms step
  EXPECT_NE(msg.find("30%"), std::string::npos) << msg;
  EXPECT_NEAR(r.tokens_per_s, 4096 / 0.1, 4096 / 0.1 * 0.02) << "the saves are not training time";
}

TEST(ProgressMonitor, WindowAdviceCountsTheCheckpointsOfTheStepsItKeeps) {
  // 0.1 s steps, a 0.2 s checkpoint every 20 steps; at step 200 (22 s in) 28.05 s are left: 12
  // blocks of 20 steps (2.2 s each) and 16 steps more fit, 456 in all. Normal steps alone said 480.
  RunFacts f = facts(20);
  MonitorSettings s = settings(2);
  s.window_end_unix = s.session_start_unix + 50.05;
  f.lease_s = 50.05;
  ProgressMonitor m(f, s);
  feed_with_saves(m, 200, 20, 0.2);
  std::string msg;
  ASSERT_TRUE(has(m.report(), WarningKind::Window, &msg));
  EXPECT_NE(msg.find("Lower train.steps to about 456"), std::string::npos) << msg;
}

TEST(ProgressMonitor, CheckpointAdviceBeyondTheRunSaysToSaveOnlyAtTheEnd) {
  // 100 steps of 0.1 s with a 0.5 s save every 10: a third of the run. An interval bringing it
  // to 3 % would be past the last step, which saves no periodic checkpoint at all.
  RunFacts f = facts(10);
  f.max_steps = f.session_steps = 100;
  ProgressMonitor m(f, settings(2));
  feed_with_saves(m, 50, 10, 0.5);
  std::string msg;
  ASSERT_TRUE(has(m.report(), WarningKind::Checkpoints, &msg));
  EXPECT_NE(msg.find("set checkpoint.interval = 0 (and checkpoint.final = true, for one save at "
                     "the end: ~0.5s)"),
            std::string::npos)
      << msg;
  // How the run still ends with a save follows checkpoint.final (the facts' final_ckpt: berth's
  // checkpoint.final = false is -1, the interval deciding; with interval 0 nothing saves).
  for (const auto& [final_ckpt, says] :
       {std::pair{1, "(the final save stays: ~0.5s)"},
        {-1, "(and checkpoint.final = true, for one save at the end: ~0.5s)"},
        {0, "(and checkpoint.final = true, for one save at the end: ~0.5s)"}}) {
    f.final_ckpt = final_ckpt;
    ProgressMonitor mf(f, settings(2));
    feed_with_saves(mf, 50, 10, 0.5);
    ASSERT_TRUE(has(mf.report(), WarningKind::Checkpoints, &msg));
    EXPECT_NE(msg.find(says), std::string::npos) << msg;
  }
}

TEST(ProgressMonitor, CheckpointWarningWaitsForAMeasuredCheckpoint) {
  // Before the first save the checkpoint time is a prior (here 100 s a save, ~10 × the run):
  // the block shows it, but no warning is raised on it.
  RunFacts f = facts(50);
  f.ckpt_prior_s = 100;
  const ProgressReport r = run(
                               2, 40, [](int64_t st) { return balanced(2, st); }, f)
                               .report();
  EXPECT_EQ(r.prediction.checkpoints_observed, 0);
  EXPECT_GT(r.prediction.checkpoint_s, 0.5 * r.prediction.total_s);
  EXPECT_FALSE(has(r, WarningKind::Checkpoints));
}

TEST(ProgressMonitor, DueRepeatsEveryNBlocksAndResets) {
  ProgressMonitor m = run(2, 60, [](int64_t s) {
    auto v = balanced(2, s);
    for (auto& x : v) x.data_wait_s = 0.03;
    return v;
  });
  const ProgressReport r = m.report();
  ASSERT_TRUE(has(r, WarningKind::DataBound));
  std::vector<size_t> logged;
  for (int i = 0; i < 12; ++i) logged.push_back(m.due(r, 5).size());
  EXPECT_EQ(logged, (std::vector<size_t>{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}));
  EXPECT_TRUE(m.due(ProgressReport{}, 5).empty());  // gone: the count resets
  EXPECT_EQ(m.due(r, 5).size(), 1u);
}

TEST(ProgressMonitor, RecordsAggregateRanks) {
  ProgressMonitor m(facts(), settings(2));
  auto v = balanced(2, 1);
  v[1].wall_s = 0.2;
  v[1].mem_gib = 2.5;
  const StepRecord& r = m.observe(1, v, 4096, 128, "first_step");
  EXPECT_DOUBLE_EQ(r.duration_s, 0.2);  // the slowest rank ends the step
  EXPECT_DOUBLE_EQ(r.mem_gib, 2.5);
  EXPECT_DOUBLE_EQ(r.comm_s, 0.010);
  EXPECT_EQ(r.tokens, 4096);
  EXPECT_THROW(m.observe(2, balanced(3, 2), 4096, 128, ""), Error);
}

TEST(ProgressMonitor, BlockFormat) {
  ProgressReport r;
  r.step = 1200;
  r.end_step = 12000;
  r.elapsed_s = 3720;
  r.prediction.total_s = 3720 + 33480;
  r.prediction.remaining_s = 33480;
  r.prediction.low_s = r.prediction.total_s - 720;
  r.prediction.high_s = r.prediction.total_s + 720;
  r.prediction.checkpoint_s = 480;
  r.tokens_per_s = 124000;
  r.tokens_per_s_rank = 15500;
  r.mfu = 0.41;
  r.peak_mem_gib = 18.7;
  r.mem_capacity_gib = 24.0;
  const double start = parse_utc_time("2026-12-03T10:11:00Z");
  EXPECT_EQ(format_progress(r, start, false),
            "[progress] step 1200/12000 (10.0%) | elapsed 1h02m | remaining 9h18m ±12m00s (ETA "
            "2026-12-03 20:31 UTC) | 124k tok/s (15.5k/rank) | MFU 41% | peak mem 18.70/24.0 GiB "
            "| checkpoints ~8m00s");
  EXPECT_EQ(format_progress(r, start, true).substr(0, 34), "[progress] [##------------------] ");
  r.mfu = -1;
  r.model_flops_per_s = 2.5e9;
  EXPECT_NE(format_progress(r, start, false).find("| 2.50 GFLOP/s |"), std::string::npos);
}

TEST(Clock, ParsesZonedTimesStrictly) {
  EXPECT_DOUBLE_EQ(parse_utc_time("1970-01-01T00:00:00Z"), 0);
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03T20:00:00Z"), 1796328000);
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03 20:00Z"), 1796328000);
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03T21:30:00+01:30"), 1796328000);
  EXPECT_DOUBLE_EQ(parse_utc_time("2024-02-29T00:00:00Z") - parse_utc_time("2024-02-28T00:00:00Z"),
                   86400);
  test::expect_error([] { parse_utc_time("2026-12-03T20:00:00"); }, {"has no zone"});
  test::expect_error([] { parse_utc_time("2026-02-30T20:00Z"); },
                     {"not a valid date", "2026-02 has days 01..28, got 30"});
  test::expect_error([] { parse_utc_time("2026-13-05T10:00Z"); }, {"the month must be 01..12"});
  test::expect_error([] { parse_utc_time("2026-12-05T24:00Z"); }, {"is not a time of day"});
  // fractional seconds (ISO 8601), with a zone; a bare point is an error, not "no zone"
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03T20:00:00.25Z"), 1796328000.25);
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03T21:00:00,5+01:00"), 1796328000.5);
  test::expect_error([] { parse_utc_time("2026-12-03T20:00:00.Z"); }, {"fraction of a second"});
  test::expect_error([] { parse_utc_time("tomorrow"); }, {"expected YYYY-MM-DD"});
  // every field is its digits only: no sign, no space, no single digit (sscanf's %2d took all
  // three, and "2026-+1-21" was January)
  for (const char* bad : {"2026-12-21T+1:00Z", "2026-12-21T 1:00Z", "2026-+1-21T00:00Z",
                          "2026-12-21T0:00Z", "+2026-12-21T00:00Z", "2026-12-21T00:00:+5Z"})
    test::expect_error([bad] { parse_utc_time(bad); }, {"cannot read the"});
  for (const char* bad : {"2026-12-21T00:00+ 1:00", "2026-12-21T00:00+1:00", "2026-12-21T00:00+01"})
    test::expect_error([bad] { parse_utc_time(bad); }, {"cannot read the zone offset"});
  test::expect_error([] { parse_utc_time("2026-12-03T20:00Zulu"); }, {"unexpected text after"});
  test::expect_error([] { parse_utc_time("2026-12-03T20:00 PST"); }, {"unexpected text after"});
  // UTC by name, as berth prints a time: what it prints reads back
  EXPECT_DOUBLE_EQ(parse_utc_time("2026-12-03T20:00UTC"), 1796328000);
  EXPECT_DOUBLE_EQ(parse_utc_time(format_utc_minute(1796328000)), 1796328000);
  test::expect_error([] { parse_utc_time("2026-12-03T20:00Zjunk"); }, {"unexpected text"});
  test::expect_error([] { parse_utc_time("2026-12-03T25:00Z"); }, {"not a valid date and time"});
  EXPECT_EQ(format_utc_iso(1796328000), "2026-12-03T20:00:00Z");
  EXPECT_DOUBLE_EQ(parse_utc_time(format_utc_iso(1796328007)), 1796328007);
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(425), "7m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(format_duration(-90), "-1m30s");
  EXPECT_EQ(format_duration(0.4), "0.4s");  // it said "0s" of a checkpoint taking 40 % of a run
  EXPECT_EQ(format_duration(0.05), "0.05s");
  EXPECT_EQ(format_duration(0.001), "0s");
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(0.97), "1s");
}

TEST(ProgressFiles, TraceRowsAndRunFactsReadBack) {
  const std::string path = ::testing::TempDir() + "/berth_trace_roundtrip.csv";
  StepRecord a;
  a.step = 7, a.duration_s = 0.125, a.tokens = 4096, a.seq_len = 128, a.compute_s = 0.1,
  a.comm_s = 0.02, a.data_wait_s = 0.005, a.mem_gib = 1.5, a.event = "ckpt+eval";
  StepRecord b = a;
  b.step = 8, b.event = "";
  {
    std::ofstream out(path);
    out << trace_csv_header() << trace_csv_row(a) << trace_csv_row(b);
  }
  const std::vector<StepRecord> rows = read_trace_csv(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].event, "ckpt+eval");
  EXPECT_EQ(rows[1].event, "");
  EXPECT_DOUBLE_EQ(rows[0].duration_s, 0.125);
  EXPECT_EQ(rows[1].tokens, 4096);
  std::remove(path.c_str());
  a.event = "bad,event";
  test::expect_error([&] { trace_csv_row(a); }, {"must not contain a comma"});

  RunFacts f = facts(50);
  f.start_step = 100, f.session_steps = 900, f.lease_s = 3600, f.warmup_steps = 20;
  const RunFacts g = read_run_facts_json(run_facts_to_json(f));
  EXPECT_EQ(g.start_step, 100);
  EXPECT_EQ(g.session_steps, 900);
  EXPECT_EQ(g.ckpt_interval, 50);
  EXPECT_EQ(g.warmup_steps, 20);
  EXPECT_DOUBLE_EQ(g.lease_s, 3600);
  ASSERT_EQ(g.schedule.size(), 1u);
  EXPECT_EQ(g.schedule[0].tokens_per_step, 4096);
}

TEST(ProgressPredictor, ConfiguredWarmupStepsAreNotTrustedForTheRate) {
  // The first 50 steps run at 0.3 s, the rest at 0.1 s; without the configured warm-up, the
  // transient detector keeps part of them only when it sees them as slow relative to the rest.
  RunFacts f = facts();
  f.warmup_steps = 50;
  ProgressPredictor p(f);
  for (int64_t s = 1; s <= 60; ++s) {
    StepRecord r;
    r.step = s, r.tokens = 4096, r.seq_len = 128, r.duration_s = s <= 50 ? 0.3 : 0.1;
    r.event = s == 1 ? "first_step" : "";
    p.observe(r);
  }
  EXPECT_NEAR(p.predict().remaining_s, 940 * 0.1, 1e-6);
  // Before any step past the warm-up, the warm-up steps are all there is: they are used.
  ProgressPredictor q(f);
  for (int64_t s = 1; s <= 10; ++s) {
    StepRecord r;
    r.step = s, r.tokens = 4096, r.seq_len = 128, r.duration_s = 0.3;
    q.observe(r);
  }
  EXPECT_NEAR(q.predict().remaining_s, 990 * 0.3, 1e-6);
}

}  // namespace
}  // namespace berth
