// Progress prediction on real training runs (one rank, in process): with injected checkpoint
// stalls and periodic evaluation the total predicted at 25 % is within 5 % of the actual; the run
// directory's trace.csv and run_facts.json replay to the same prediction; injected phenomena (a
// leak, slow data loading, a window that ends too early) raise their warnings. Run serially
// (ctest RUN_SERIAL): a concurrent test would change the step time mid-run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/cluster/progress.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/step_metrics.h"
#include "runtime/train/trainer.h"
#include "tests/mpi_world.h"
#include "tests/synthetic_data.h"

namespace berth {
namespace {

class ProgressRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("berth_progress_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    write_token_dataset((dir_ / "train.h5").string(), test::rule_dataset(200, 40, 1));
    write_token_dataset((dir_ / "val.h5").string(), test::rule_dataset(30, 40, 2));
  }
  void TearDown() override {
    cpu::set_num_threads(2);
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  RunConfig config(int64_t steps) const {
    RunConfig c;
    c.run.name = "p";
    c.run.out_dir = (dir_ / "runs").string();
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.d_model = 32;
    c.model.vocab_size = test::kRuleVocab;
    c.model.max_seq_len = 32;
    c.data.train = (dir_ / "train.h5").string();
    c.data.val = (dir_ / "val.h5").string();
    c.data.seq_len = 32;
    c.train.micro_batch_size = 8;
    c.train.steps = steps;
    c.train.log_interval = 1000;
    c.checkpoint.final = false;
    c.progress.warmup_steps = 5;
    return c;
  }

  // metrics.jsonl of the run, one object per step.
  std::vector<nlohmann::json> train(const RunConfig& c) const {
    {
      Trainer t(c, test::world());
      t.run();
    }
    std::vector<nlohmann::json> out;
    std::istringstream in(read_text_file((dir_ / "runs" / c.run.name / "metrics.jsonl").string()));
    for (std::string line; std::getline(in, line);) {
      out.push_back(nlohmann::json::parse(line));
      // Every block row lists its warnings, [] for none (the key was left out then).
      EXPECT_EQ(out.back().contains("warnings"), out.back().contains("predicted_total_s")) << line;
    }
    return out;
  }

  static bool warned(const std::vector<nlohmann::json>& m, const std::string& kind) {
    for (const auto& j : m) {
      if (!j.contains("warnings")) continue;
      for (const auto& w : j["warnings"])
        if (w == kind) return true;
    }
    return false;
  }

  std::filesystem::path dir_;
};

TEST_F(ProgressRunTest, TotalPredictedAtQuarterIsWithinFivePercent) {
  // This VM's compute speed wanders by ±15 % in blocks of tens of steps, which no predictor can
  // see coming. Each step is ~3 ms of real training plus an injected 8 ms (debug.slow_rank), so
  // the machine's noise is a small part of the total; what remains of it is measured below.
  cpu::set_num_threads(1);
  RunConfig c = config(200);
  c.debug.slow_rank = 0;
  c.debug.slow_rank_s = 0.008;
  c.checkpoint.interval = 40;          // stalls at 40, 80, 120, 160
  c.debug.checkpoint_pause_s = 0.3;    // each ~ 30 normal steps
  c.eval.interval = 25;
  c.eval.batches = 4;
  c.progress.interval = 50;            // a prediction at step 50 = 25 %
  const std::vector<nlohmann::json> m = train(c);
  ASSERT_EQ(m.size(), 200u);
  double actual = 0;
  for (const auto& j : m) actual += j["wall_s"].get<double>();
  const nlohmann::json& q = m[49];
  ASSERT_TRUE(q.contains("predicted_total_s")) << q.dump();
  const double predicted = q["predicted_total_s"].get<double>();
  // The part of the error explained by the change of the mean normal step time after step 50 is
  // measured and allowed on top of the 5 %. Miscounting one checkpoint stall alone would be a
  // 10 % error.
  double before = 0, after = 0;
  int n_before = 0, n_after = 0;
  for (size_t i = 5; i < m.size(); ++i) {
    if (m[i].contains("event")) continue;
    (i < 50 ? before : after) += m[i]["wall_s"].get<double>();
    (i < 50 ? n_before : n_after) += 1;
  }
  const double drift = std::fabs(after / n_after - before / n_before) * n_after;
  std::printf("progress at 25 %%: predicted total %.3f s, actual %.3f s, error %.2f %% (machine "
              "speed change explains %.2f %%)\n",
              predicted, actual, 100 * std::fabs(predicted - actual) / actual,
              100 * drift / actual);
  EXPECT_LT(std::fabs(predicted - actual), 0.05 * actual + drift)
      << "predicted " << predicted << " s at 25 %, actual " << actual << " s";
  EXPECT_LE(q["predicted_low_s"].get<double>(), predicted);
  EXPECT_GE(q["predicted_high_s"].get<double>(), predicted);
  EXPECT_EQ(m[39]["event"], "ckpt");
  EXPECT_EQ(m[24]["event"], "eval");
  EXPECT_EQ(m[0]["event"], "first_step+eval");

  // The run directory replays: the first 50 trace rows with run_facts.json give the same total.
  const std::string run = (dir_ / "runs/p").string();
  std::vector<StepRecord> rows = read_trace_csv(run + "/trace.csv");
  ASSERT_EQ(rows.size(), 200u);
  ProgressPredictor p(read_run_facts_json(run + "/run_facts.json"));
  for (size_t i = 0; i < 50; ++i) p.observe(rows[i]);
  EXPECT_NEAR(p.predict().total_s, predicted, 1e-4 * predicted);
}

TEST_F(ProgressRunTest, LeakRaisesMemoryWarning) {
  RunConfig c = config(60);
  c.progress.interval = 20;
  c.debug.leak_mib_per_step = 8;  // 480 MiB over the run; capacity leaves room for ~200
  c.progress.mem_capacity_gib = host_rss_gib() + 0.2;
  EXPECT_TRUE(warned(train(c), "memory"));
  RunConfig clean = config(60);
  clean.run.name = "p-clean";  // a run of its own: "p" holds the leaking run's results
  clean.progress.interval = 20;
  clean.progress.mem_capacity_gib = c.progress.mem_capacity_gib;
  EXPECT_FALSE(warned(train(clean), "memory"));
}

TEST_F(ProgressRunTest, SlowDataLoadingRaisesDataBoundWarning) {
  RunConfig c = config(40);
  c.progress.interval = 20;
  c.debug.data_delay_s = 0.01;
  EXPECT_TRUE(warned(train(c), "data-bound"));
}

TEST_F(ProgressRunTest, WindowEndingBeforeFinishRaisesWindowWarning) {
  RunConfig c = config(100);
  c.progress.interval = 20;
  c.debug.slow_rank = 0;  // 100 steps of >= 30 ms: longer than the 1–2 s window
  c.debug.slow_rank_s = 0.03;
  c.progress.window_end = format_utc_iso(unix_now() + 2.0);
  const std::vector<nlohmann::json> m = train(c);
  EXPECT_TRUE(warned(m, "window"));
  EXPECT_FALSE(warned(m, "data-bound"));
}

}  // namespace
}  // namespace berth
