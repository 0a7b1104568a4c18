// Pipeline schedules as data: stage_layers splits layers contiguously; AFAB and 1F1B lists,
// played together for every pp in {1..4} and M in {1..8}, have every transfer met by its
// neighbour, no deadlock, and the expected micro-batches in flight; broken lists are caught.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/pipeline.h"
#include "runtime/core/check.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

TEST(Pipeline, StageLayersAreContiguousAndBalanced) {
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int s = 0; s < 5; ++s) {
    const LayerRange r = stage_layers(12, 5, s);
    EXPECT_EQ(r.begin, next);
    next = r.end;
    sizes.push_back(r.size());
  }
  EXPECT_EQ(next, 12);
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 2, 2}));
  EXPECT_EQ(stage_layers(4, 1, 0).size(), 4);
  test::expect_error([] { stage_layers(2, 4, 0); }, {"parallel.pp <= model.n_layer"});
  test::expect_error([] { stage_layers(8, 4, 4); }, {"stage 4 is not in 0..3"});
}

TEST(Pipeline, ScheduleListsReadLikeMegatron) {
  EXPECT_EQ(describe(schedule_1f1b(2, 0, 2)), "F0 SF0 F1 SF1 RB0 B0 RB1 B1");
  EXPECT_EQ(describe(schedule_1f1b(2, 1, 2)), "RF0 F0 B0 SB0 RF1 F1 B1 SB1");
  EXPECT_EQ(describe(schedule_afab(2, 1, 2)), "RF0 F0 RF1 F1 B0 SB0 B1 SB1");
  EXPECT_EQ(describe(schedule_1f1b(1, 0, 2)), "F0 B0 F1 B1");
}

TEST(Pipeline, EveryLayoutPlaysWithoutDeadlockAndBoundedInFlight) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int M = 1; M <= 8; ++M) {
      for (bool one_f_one_b : {true, false}) {
        std::vector<std::vector<PipeAction>> lists;
        for (int s = 0; s < pp; ++s) {
          lists.push_back(one_f_one_b ? schedule_1f1b(pp, s, M) : schedule_afab(pp, s, M));
        }
        const PlayResult r = play_schedules(lists, M);
        ASSERT_TRUE(r.ok) << (one_f_one_b ? "1f1b" : "afab") << " pp " << pp << " M " << M
                          << ": " << r.error;
        for (int s = 0; s < pp; ++s) {
          const int expect = one_f_one_b ? std::min(pp - s, M) : M;
          EXPECT_EQ(r.max_in_flight[size_t(s)], expect)
              << (one_f_one_b ? "1f1b" : "afab") << " pp " << pp << " M " << M << " stage " << s;
          // The executor sizes a stage's activation slots from its own list alone.
          EXPECT_EQ(max_in_flight(lists[size_t(s)]), expect)
              << (one_f_one_b ? "1f1b" : "afab") << " pp " << pp << " M " << M << " stage " << s;
        }
      }
    }
  }
}

TEST(Pipeline, ForwardOnlyListsPlayWithOneMicroBatchInFlight) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int M = 1; M <= 5; ++M) {
      std::vector<std::vector<PipeAction>> lists;
      for (int s = 0; s < pp; ++s) {
        lists.push_back(schedule_forward_only(pp, s, M));
        EXPECT_EQ(max_in_flight(lists.back()), 1);
      }
      // play_schedules wants backwards too: check the transfers pair up by construction.
      for (int s = 0; s + 1 < pp; ++s) {
        int sends = 0, recvs = 0;
        for (const PipeAction& a : lists[size_t(s)]) sends += a.op == PipeOp::kSendForward;
        for (const PipeAction& a : lists[size_t(s) + 1]) recvs += a.op == PipeOp::kRecvForward;
        EXPECT_EQ(sends, M);
        EXPECT_EQ(recvs, M);
      }
    }
  }
  EXPECT_EQ(describe(schedule_forward_only(3, 1, 2)), "RF0 F0 SF0 RF1 F1 SF1");
}

TEST(Pipeline, BrokenListsAreCaught) {
  // Stage 0 waits for a gradient before sending the activation it depends on: deadlock.
  std::vector<std::vector<PipeAction>> lists = {schedule_afab(2, 0, 1), schedule_afab(2, 1, 1)};
  std::swap(lists[0][1], lists[0][2]);  // F0 RB0 SF0 B0
  std::swap(lists[0][0], lists[0][1]);  // RB0 F0 SF0 B0
  PlayResult r = play_schedules(lists, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("stage 0 waits in [RB0]"), std::string::npos) << r.error;
  // A send of something not computed yet.
  lists = {schedule_afab(2, 0, 1), schedule_afab(2, 1, 1)};
  std::swap(lists[0][0], lists[0][1]);  // SF0 F0 ...
  r = play_schedules(lists, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("before computing it"), std::string::npos) << r.error;
  // A micro-batch forgotten by one stage.
  lists = {schedule_1f1b(2, 0, 2), schedule_1f1b(2, 1, 1)};
  r = play_schedules(lists, 2);
  EXPECT_FALSE(r.ok);
  // A transfer off the end of the pipeline.
  lists = {{{PipeOp::kRecvForward, 0}, {PipeOp::kForward, 0}, {PipeOp::kBackward, 0}}};
  r = play_schedules(lists, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("no neighbour"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace berth
