// take_lease (runtime/train/lease_keeper.h) on a real ledger and the real clock (upper bounds on
// the waits leave room for a loaded machine): a relaunch waits
// for the leases of killed holders of this host, gives a live one 5 s, and refuses the rest.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/train/lease_keeper.h"

namespace berth {
namespace {

class TakeLease : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("berth_test_take_lease_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    ledger_ = open_sqlite_ledger((dir_ / "ledger.db").string(), LedgerOptions{});
    std::vector<Device> slots;
    for (int i = 0; i < 2; ++i)
      slots.push_back(Device{0, host_name(), "cpu", i, "cpu", int64_t(1) << 30, ""});
    ledger_->register_devices(slots);
  }
  void TearDown() override {
    for (pid_t p : children_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  // A booking of `n` devices open now, by this user.
  int64_t book(int n) {
    ReserveRequest q;
    q.count = n, q.start = unix_now(), q.duration_s = 3600, q.priority = 3;
    q.owner = current_user();
    const BookingResult b = ledger_->reserve(q);
    EXPECT_TRUE(b.booked) << b.reason;
    return b.booked ? b.reservations.front().id : 0;
  }
  // A pid that was a process of this host and is no more.
  static int64_t dead_pid() {
    const pid_t p = ::fork();
    if (p == 0) ::_exit(0);
    ::waitpid(p, nullptr, 0);
    return p;
  }
  int64_t live_pid() {
    const pid_t p = ::fork();
    if (p == 0) {
      ::pause();
      ::_exit(0);
    }
    children_.push_back(p);
    return p;
  }
  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  std::filesystem::path dir_;
  std::unique_ptr<LedgerStore> ledger_;
  std::vector<pid_t> children_;
};

TEST_F(TakeLease, WaitsForAKilledHoldersLeaseToLapse) {
  const int64_t id = book(1);
  const LeaseResult old = ledger_->acquire_lease(id, current_user(), host_name(), dead_pid(), 1.5);
  ASSERT_TRUE(old.ok);
  const auto t0 = std::chrono::steady_clock::now();
  const LeaseResult l = take_lease(*ledger_, id, host_name(), 60, 30);
  ASSERT_TRUE(l.ok) << l.reason;
  EXPECT_GT(l.lease.token, old.lease.token);
  EXPECT_GE(seconds_since(t0), 1.0);
  EXPECT_LT(seconds_since(t0), 6.0);
}

TEST_F(TakeLease, WaitsForEveryDeadLeaseOnItsDevices) {
  const int64_t a = book(1), b = book(1);
  ASSERT_TRUE(ledger_->acquire_lease(a, current_user(), host_name(), dead_pid(), 1).ok);
  ASSERT_TRUE(ledger_->acquire_lease(b, current_user(), host_name(), dead_pid(), 2.5).ok);
  ledger_->cancel(a, current_user());
  ledger_->cancel(b, current_user());
  const int64_t both = book(2);  // both devices, each still in a killed job's lease
  const auto t0 = std::chrono::steady_clock::now();
  const LeaseResult l = take_lease(*ledger_, both, host_name(), 60, 30);
  ASSERT_TRUE(l.ok) << l.reason;
  EXPECT_GE(seconds_since(t0), 2.0) << "the longer of the two leases";
  EXPECT_LT(seconds_since(t0), 9.0);
}

TEST_F(TakeLease, ALiveHolderGetsItsGraceThenIsRefused) {
  const int64_t id = book(1);
  const int64_t pid = live_pid();
  ASSERT_TRUE(ledger_->acquire_lease(id, current_user(), host_name(), pid, 60).ok);
  const auto t0 = std::chrono::steady_clock::now();
  const LeaseResult l = take_lease(*ledger_, id, host_name(), 60, 30);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.reason.find(fmt::format("already held by pid {}", pid)), std::string::npos)
      << l.reason;
  EXPECT_GE(seconds_since(t0), 4.5) << "5 s for a holder of this host to end";
  EXPECT_LT(seconds_since(t0), 12.0);
}

TEST_F(TakeLease, AHolderThatEndsDuringItsGraceIsWaitedFor) {
  const int64_t id = book(1);
  const int64_t pid = live_pid();
  ASSERT_TRUE(ledger_->acquire_lease(id, current_user(), host_name(), pid, 3).ok);
  std::thread killer([pid] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ::kill(pid_t(pid), SIGKILL);  // a zombie until TearDown reaps it: gone all the same
  });
  const LeaseResult l = take_lease(*ledger_, id, host_name(), 60, 30);
  killer.join();
  EXPECT_TRUE(l.ok) << l.reason;
}

TEST_F(TakeLease, BeyondItsLimitOrOnAnotherHostItIsRefusedAtOnce) {
  const int64_t id = book(1);
  ASSERT_TRUE(ledger_->acquire_lease(id, current_user(), host_name(), dead_pid(), 120).ok);
  auto t0 = std::chrono::steady_clock::now();
  LeaseResult l = take_lease(*ledger_, id, host_name(), 60, 2);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.reason.find("which is no longer running; its lease lapses at"), std::string::npos)
      << l.reason;
  EXPECT_NE(l.reason.find("launch again after it"), std::string::npos) << l.reason;
  EXPECT_LT(seconds_since(t0), 2.0);
  // A holder on another host: nothing here says whether it lives.
  const int64_t other = book(1);
  ASSERT_TRUE(ledger_->acquire_lease(other, current_user(), "elsewhere", dead_pid(), 120).ok);
  t0 = std::chrono::steady_clock::now();
  l = take_lease(*ledger_, other, host_name(), 60, 30);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.reason.find("on elsewhere"), std::string::npos) << l.reason;
  EXPECT_LT(seconds_since(t0), 2.0);
}

}  // namespace
}  // namespace berth
