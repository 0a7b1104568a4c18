// The communicator watchdog (runtime/comm/watchdog.h) on a fake clock, its thread on the real one,
// and WatchedCall's reporting. The end-to-end case (a hung rank ends an mpirun job with status 5)
// is in tests/mpi/train_mpirun.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/watchdog.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

struct Fake {
  double now = 100.0;
  std::vector<std::string> fired;
};

TEST(Watchdog, CallsThatReturnInTimeNeverFire) {
  Fake f;
  CallWatchdog w(
      10, [&](const std::string& m) { f.fired.push_back(m); }, [&] { return f.now; });
  for (int i = 0; i < 100; ++i) {
    const uint64_t t = w.open("all_reduce", 4096, 2);
    f.now += 9.0;
    EXPECT_FALSE(w.check());
    w.close(t);
  }
  EXPECT_EQ(w.open_calls(), 0u);
  f.now += 1000;
  EXPECT_FALSE(w.check());
  EXPECT_TRUE(f.fired.empty());
}

TEST(Watchdog, AHungCallFiresOnceNamingItsOpSizeAndWait) {
  Fake f;
  CallWatchdog w(
      10, [&](const std::string& m) { f.fired.push_back(m); }, [&] { return f.now; });
  w.open("reduce_scatter", 3 << 20, 8);
  f.now += 10.0;
  EXPECT_FALSE(w.check()) << "at the limit, not past it";
  f.now += 2.5;
  EXPECT_TRUE(w.check());
  ASSERT_EQ(f.fired.size(), 1u);
  const std::string& m = f.fired[0];
  EXPECT_NE(m.find("reduce_scatter of 3.0 MiB in a group of 8 rank(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("after 12.5 s (limit 10 s)"), std::string::npos) << m;
  EXPECT_NE(m.find("parallel.comm_timeout_s"), std::string::npos) << m;
  f.now += 100;
  EXPECT_FALSE(w.check()) << "once per call";
  EXPECT_EQ(f.fired.size(), 1u);
}

TEST(Watchdog, ProbedCallsCloseWhenDoneAndTheOldestOpenOneCounts) {
  Fake f;
  CallWatchdog w(
      5, [&](const std::string& m) { f.fired.push_back(m); }, [&] { return f.now; });
  bool first_done = false;
  w.open("all_gather", 1024, 4, [&] { return first_done; });  // opened at 100
  f.now = 103;
  const uint64_t second = w.open("broadcast", 1024, 4);  // opened at 103
  f.now = 104;
  EXPECT_FALSE(w.check());
  first_done = true;  // the device finished the first call
  f.now = 107;        // the first would be 7 s old, the second is 4 s old
  EXPECT_FALSE(w.check());
  EXPECT_EQ(w.open_calls(), 1u);
  f.now = 108.5;  // the second is 5.5 s old
  EXPECT_TRUE(w.check());
  ASSERT_EQ(f.fired.size(), 1u);
  EXPECT_NE(f.fired[0].find("broadcast"), std::string::npos) << f.fired[0];
  w.close(second);
  EXPECT_EQ(w.open_calls(), 0u);
}

TEST(Watchdog, AFailedProbeFiresAtOnceNamingTheCallAndTheReason) {
  Fake f;
  CallWatchdog w(
      600, [&](const std::string& m) { f.fired.push_back(m); }, [&] { return f.now; });
  std::string error;
  int polls = 0;
  w.open(
      "all_reduce", 4096, 8, [] { return false; },
      [&] {
        ++polls;
        return error;
      });
  f.now = 101;
  EXPECT_FALSE(w.check()) << "no error yet, far from the timeout";
  error = "NCCL asynchronous error on rank 3/8@node2: remote process exited or there was a network "
          "error";
  f.now = 102.5;
  EXPECT_TRUE(w.check()) << "an asynchronous error does not wait for the timeout";
  ASSERT_EQ(f.fired.size(), 1u);
  EXPECT_NE(f.fired[0].find("communicator error: all_reduce of 4096 bytes in a group of 8 rank(s) "
                            "failed after 2.5 s: NCCL asynchronous error on rank 3/8@node2"),
            std::string::npos)
      << f.fired[0];
  const int after_fire = polls;
  EXPECT_FALSE(w.check()) << "once per call";
  EXPECT_EQ(polls, after_fire) << "a call that fired is not probed again";
  // A call that completed is not asked for errors: it closes.
  const int before = polls;
  w.open("broadcast", 8, 2, [] { return true; }, [&] {
    ++polls;
    return std::string("stale");
  });
  EXPECT_FALSE(w.check());
  EXPECT_EQ(polls, before);
  EXPECT_EQ(f.fired.size(), 1u);
}

TEST(Watchdog, ItsThreadFiresOnTheRealClock) {
  std::atomic<int> fired{0};
  std::string message;
  CallWatchdog w(0.2, [&](const std::string& m) {
    message = m;
    fired.fetch_add(1);
  });
  w.start(0.02);
  const uint64_t quick = w.open("barrier", 0, 2);
  w.close(quick);
  w.open("recv", 8, 2);
  const auto t0 = std::chrono::steady_clock::now();
  while (fired.load() == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(fired.load(), 1);
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 4.0);  // the timeout plus a poll, with room for a loaded machine
  EXPECT_NE(message.find("recv of 8 bytes"), std::string::npos) << message;
}

TEST(Watchdog, WatchedCallReportsToTheInstalledWatchdogOnly) {
  { const WatchedCall none("all_reduce", 16, 2); }  // nothing installed: nothing happens
  auto owned = std::make_unique<CallWatchdog>(60, [](const std::string&) {});
  CallWatchdog* w = owned.get();
  install_comm_watchdog(std::move(owned));
  ASSERT_EQ(comm_watchdog(), w);
  {
    const WatchedCall call("all_reduce", 16, 2);
    EXPECT_EQ(w->open_calls(), 1u);
  }
  EXPECT_EQ(w->open_calls(), 0u);
  install_comm_watchdog(nullptr);
  EXPECT_EQ(comm_watchdog(), nullptr);
  install_comm_watchdog(0, 5);  // a timeout of 0 installs none
  EXPECT_EQ(comm_watchdog(), nullptr);
}

TEST(Watchdog, NeedsAPositiveTimeout) {
  EXPECT_THROW(CallWatchdog(0, [](const std::string&) {}), Error);
  EXPECT_THROW(CallWatchdog(-1, [](const std::string&) {}), Error);
}

}  // namespace
}  // namespace berth
