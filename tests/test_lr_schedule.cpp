// Learning-rate schedules (runtime/train/lr_schedule.h): linear warmup, cosine decay to min_lr,
// constant, degenerate warmup >= steps, and the schedule-name parser.
//
// Expected values are hand-derived (cos of 0, π/3, π/2, 2π/3) and compared with EXPECT_DOUBLE_EQ
// (4 ulps): each is a handful of double operations on exactly chosen inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/train/lr_schedule.h"

namespace berth {
namespace {

constexpr double kLr = 6e-4;
constexpr double kMinLr = 6e-5;

// ---- warmup -------------------------------------------------------------------------------------

TEST(LrSchedule, WarmupIsLinearUpToLr) {
  const int64_t warmup = 10, steps = 100;
  for (const LrSchedule sched : {LrSchedule::COSINE, LrSchedule::CONSTANT}) {
    for (int64_t s = 0; s < warmup; s++) {
      EXPECT_DOUBLE_EQ(lr_at(s, steps, kLr, kMinLr, warmup, sched), kLr * double(s + 1) / 10.0)
          << "step " << s;
    }
    EXPECT_DOUBLE_EQ(lr_at(0, steps, kLr, kMinLr, warmup, sched), kLr / 10.0);
    EXPECT_DOUBLE_EQ(lr_at(warmup - 1, steps, kLr, kMinLr, warmup, sched), kLr);
  }
}

// ---- cosine -------------------------------------------------------------------------------------

TEST(LrSchedule, CosineStartsAtLrWhenWarmupEnds) {
  EXPECT_DOUBLE_EQ(lr_at(10, 100, kLr, kMinLr, 10, LrSchedule::COSINE), kLr);
  EXPECT_DOUBLE_EQ(lr_at(0, 100, kLr, kMinLr, 0, LrSchedule::COSINE), kLr);  // no warmup
  EXPECT_DOUBLE_EQ(lr_at(0, 1, kLr, kMinLr, 0, LrSchedule::COSINE), kLr);    // a 1-step run
}

TEST(LrSchedule, CosineMidpointIsTheMeanOfLrAndMinLr) {
  // warmup 10, 100 decay steps: step 60 is p = 1/2.
  EXPECT_DOUBLE_EQ(lr_at(60, 110, kLr, kMinLr, 10, LrSchedule::COSINE), (kLr + kMinLr) / 2);
  EXPECT_DOUBLE_EQ(lr_at(50, 100, kLr, 0.0, 0, LrSchedule::COSINE), kLr / 2);
}

// steps = 3, no warmup, min_lr 0: p = 0, 1/3, 2/3 -> lr, ¾·lr, ¼·lr (what `berth train` logs).
TEST(LrSchedule, CosineThreeStepValues) {
  EXPECT_DOUBLE_EQ(lr_at(0, 3, 3e-4, 0.0, 0, LrSchedule::COSINE), 3e-4);
  EXPECT_DOUBLE_EQ(lr_at(1, 3, 3e-4, 0.0, 0, LrSchedule::COSINE), 2.25e-4);
  EXPECT_DOUBLE_EQ(lr_at(2, 3, 3e-4, 0.0, 0, LrSchedule::COSINE), 7.5e-5);
}

// Decay is strictly decreasing, stays above min_lr, ends within the last cosine step of it and is
// exactly min_lr from step `steps` on.
TEST(LrSchedule, CosineDecaysTowardMinLrAndNeverBelow) {
  const int64_t warmup = 10, steps = 110, decay = steps - warmup;
  double prev = kLr + 1.0;
  for (int64_t s = warmup; s < steps; s++) {
    const double v = lr_at(s, steps, kLr, kMinLr, warmup, LrSchedule::COSINE);
    EXPECT_LT(v, prev) << "step " << s;
    EXPECT_GT(v, kMinLr) << "step " << s;
    prev = v;
  }
  // Last step: p = 1 − 1/D; lr − min_lr times ½(1 − cos(π/D)) ≤ π²/(4D²) ≈ 2.5e-4 for D = 100.
  const double last = lr_at(steps - 1, steps, kLr, kMinLr, warmup, LrSchedule::COSINE);
  EXPECT_LE(last - kMinLr, (kLr - kMinLr) * M_PI * M_PI / (4.0 * double(decay * decay)));
  for (const int64_t s : {steps, steps + 1, steps + 1000}) {
    EXPECT_DOUBLE_EQ(lr_at(s, steps, kLr, kMinLr, warmup, LrSchedule::COSINE), kMinLr)
        << "step " << s;
  }
}

// Over a sweep of shapes: every value is finite and in (0, lr]; after warmup, >= min_lr.
TEST(LrSchedule, CosineStaysWithinMinLrAndLr) {
  for (const int64_t steps : {1, 2, 3, 10, 100}) {
    for (const int64_t warmup : {0, 1, 5, 100, 150}) {
      for (const double min_lr : {0.0, 1e-5, kLr}) {
        for (int64_t s = 0; s < steps + 5; s++) {
          const double v = lr_at(s, steps, kLr, min_lr, warmup, LrSchedule::COSINE);
          ASSERT_TRUE(std::isfinite(v)) << steps << "/" << warmup << "/" << min_lr << " step " << s;
          // lr, up to a few ulps of rounding in min_lr + ½(lr − min_lr)·2
          ASSERT_LE(v, kLr * (1 + 1e-15)) << steps << "/" << warmup << " step " << s;
          if (s >= warmup) {
            ASSERT_GE(v, min_lr) << steps << "/" << warmup << "/" << min_lr << " step " << s;
          } else {
            ASSERT_GT(v, 0.0);
          }
        }
      }
    }
  }
}

// ---- constant -----------------------------------------------------------------------------------

TEST(LrSchedule, ConstantIsLrAfterWarmup) {
  for (const int64_t warmup : {0, 5}) {
    for (int64_t s = warmup; s < 60; s++) {  // past the 50 steps too
      EXPECT_DOUBLE_EQ(lr_at(s, 50, kLr, kMinLr, warmup, LrSchedule::CONSTANT), kLr)
          << "warmup " << warmup << " step " << s;
    }
  }
}

// ---- warmup >= steps ----------------------------------------------------------------------------

// The whole run is warmup: lr·(s+1)/W at every step, so the run never reaches lr when W > steps.
TEST(LrSchedule, WarmupLongerThanTheRun) {
  const int64_t warmup = 20, steps = 10;
  for (const LrSchedule sched : {LrSchedule::COSINE, LrSchedule::CONSTANT}) {
    for (int64_t s = 0; s < steps; s++) {
      EXPECT_DOUBLE_EQ(lr_at(s, steps, kLr, kMinLr, warmup, sched), kLr * double(s + 1) / 20.0)
          << "step " << s;
    }
    EXPECT_DOUBLE_EQ(lr_at(steps - 1, steps, kLr, kMinLr, warmup, sched), kLr / 2);
  }
}

TEST(LrSchedule, WarmupEqualToTheRun) {
  const int64_t steps = 8;
  EXPECT_DOUBLE_EQ(lr_at(steps - 1, steps, kLr, kMinLr, steps, LrSchedule::COSINE), kLr);
  // No decay steps left: cosine falls back to min_lr past the run, constant stays at lr.
  EXPECT_DOUBLE_EQ(lr_at(steps, steps, kLr, kMinLr, steps, LrSchedule::COSINE), kMinLr);
  EXPECT_DOUBLE_EQ(lr_at(steps, steps, kLr, kMinLr, steps, LrSchedule::CONSTANT), kLr);
}

// ---- names --------------------------------------------------------------------------------------

TEST(LrSchedule, ParsesKnownNames) {
  EXPECT_EQ(parse_lr_schedule("cosine"), LrSchedule::COSINE);
  EXPECT_EQ(parse_lr_schedule("constant"), LrSchedule::CONSTANT);
}

TEST(LrSchedule, UnknownNameIsAnErrorListingTheChoices) {
  for (const std::string name : {"linear", "", "Cosine", "cosine "}) {
    try {
      parse_lr_schedule(name);
      ADD_FAILURE() << "'" << name << "' was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("unknown lr_schedule \"" + name + "\""), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"constant\""), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"cosine\""), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace berth
