// The reservation ledger on real SQLite files with an injected clock: booking rules, exact
// earliest start (against brute force), priorities and preemption, the 7-day split, malformed
// requests, permissions, idempotency, leases and fencing tokens, schema migration, and real
// processes: 32 concurrent bookers of the last window, and a booker killed inside its transaction.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/cluster/ledger.h"
#include "runtime/config/cluster_files.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

constexpr double kT0 = 1796328000;  // 2026-12-03T20:00:00Z
constexpr double kH = 3600;

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("berth_ledger_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "ledger.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  LedgerOptions options() {
    LedgerOptions o;
    o.clock = [this] { return now_; };
    o.policy.admins = {"admin"};
    o.policy.preemptors = {"urgent"};
    return o;
  }
  std::unique_ptr<LedgerStore> open() { return open_sqlite_ledger(path_, options()); }

  static std::vector<Device> slots(const std::string& host, int n, const std::string& model = "cpu",
                                   int64_t mem = int64_t(8) << 30) {
    std::vector<Device> v;
    for (int i = 0; i < n; ++i) v.push_back(Device{0, host, "cpu", i, model, mem, ""});
    return v;
  }

  static ReserveRequest req(int64_t n, double start, double hours, int prio = 3,
                            const std::string& owner = "alice") {
    ReserveRequest q;
    q.count = n;
    q.start = start;
    q.duration_s = hours * kH;
    q.priority = prio;
    q.owner = owner;
    return q;
  }

  // Pairs of active bookings that share a device and overlap in time (must be none).
  int64_t overlaps() {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db,
                       "SELECT COUNT(*) FROM booked a JOIN booked b ON a.device = b.device AND "
                       "a.reservation < b.reservation JOIN reservations ra ON ra.id = "
                       "a.reservation JOIN reservations rb ON rb.id = b.reservation WHERE "
                       "ra.state = 'active' AND rb.state = 'active' AND ra.start < rb.end AND "
                       "rb.start < ra.end",
                       -1, &s, nullptr);
    sqlite3_step(s);
    const int64_t n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
  }

  int64_t rows(const char* table) {
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, (std::string("SELECT COUNT(*) FROM ") + table).c_str(), -1, &s, nullptr);
    sqlite3_step(s);
    const int64_t n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
  }

  std::filesystem::path dir_;
  std::string path_;
  double now_ = kT0;
};

TEST_F(LedgerTest, RegisteringCountsOnlyNewAndChangedDevices) {
  // The same devices again (a node's start-up script) counted as "2 new or changed" every time.
  auto l = open();
  EXPECT_EQ(l->register_devices(slots("n1", 2)), 2);
  EXPECT_EQ(l->register_devices(slots("n1", 2)), 0);
  EXPECT_EQ(l->register_devices(slots("n1", 3)), 1);                           // one more slot
  EXPECT_EQ(l->register_devices(slots("n1", 3, "cpu", int64_t(4) << 30)), 3);  // memory changed
  EXPECT_EQ(l->devices().size(), 3u);
}

TEST_F(LedgerTest, TouchingWindowsBothSucceedOverlapsAreRefused) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0 + 2 * kH, 2)).booked);        // [2h, 4h)
  EXPECT_TRUE(l->reserve(req(1, kT0 + 4 * kH, 1)).booked);        // touches the end
  EXPECT_TRUE(l->reserve(req(1, kT0 + 1 * kH, 1)).booked);        // touches the start
  for (auto [s, h] : {std::pair{1.5, 1.0}, {3.5, 1.0}, {2.5, 0.5}, {1.0, 5.0}}) {  // front, tail,
    const BookingResult r = l->reserve(req(1, kT0 + s * kH, h));  // containment, contains
    EXPECT_FALSE(r.booked) << s << " " << h;
    EXPECT_FALSE(r.blockers.empty());
    EXPECT_GE(r.earliest_start, kT0 + 5 * kH);
  }
  EXPECT_EQ(overlaps(), 0);
}

// Bookings are shown to the second, so they start and end on whole seconds: a start taken from
// a clock at 20:00:00.43 printed as 20:00:00, its end as 21:00:00, and a booking asked for at that
// printed end overlapped the first by 0.43 s and was refused, suggesting the same start forever.
TEST_F(LedgerTest, WindowsAreWholeSecondsSoTheShownEndCanBeBooked) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  now_ = kT0 + 0.43;
  ReserveRequest first = req(1, kT0, 1);
  first.start.reset();  // --start earliest: now, rounded down
  const BookingResult a = l->reserve(first);
  ASSERT_TRUE(a.booked);
  EXPECT_EQ(a.reservations.front().start, kT0);
  EXPECT_EQ(a.reservations.front().end, kT0 + kH);
  EXPECT_TRUE(l->reserve(req(1, a.reservations.front().end, 1)).booked) << "at the shown end";
  // A fractional duration is rounded up; a fractional start asked for, down (its replay with
  // the same idempotency key is the same request).
  l->register_devices(slots("n2", 1));
  ReserveRequest late = req(1, kT0 + 1800.5, 0);
  late.duration_s = 90.25;
  late.idempotency_key = "k1";
  const BookingResult b = l->reserve(late);
  ASSERT_TRUE(b.booked) << b.reason;
  EXPECT_EQ(b.reservations.front().start, kT0 + 1800);
  EXPECT_EQ(b.reservations.front().end, kT0 + 1800 + 91);
  const BookingResult again = l->reserve(late);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.reservations.front().id, b.reservations.front().id);
  // berth extend --by 1.5s: the end stays a whole second
  const Reservation x = l->extend(b.reservations.front().id, 1.5, "alice");
  EXPECT_EQ(x.end, kT0 + 1800 + 93);
  EXPECT_EQ(overlaps(), 0);
}

// A booking for now takes its lease at once even where the policy allows no start slack (its
// start is now rounded down, not up into the next second).
TEST_F(LedgerTest, ABookingForNowTakesItsLeaseAtOnceWithNoStartSlack) {
  LedgerOptions o = options();
  o.policy.start_slack_s = 0;
  auto l = open_sqlite_ledger(path_, o);
  l->register_devices(slots("n1", 1));
  now_ = kT0 + 0.9;
  ReserveRequest q = req(1, kT0, 1);
  q.start.reset();
  const BookingResult r = l->reserve(q);
  ASSERT_TRUE(r.booked);
  const LeaseResult lease = l->acquire_lease(r.reservations.front().id, "alice", "n1", 10, 60);
  EXPECT_TRUE(lease.ok) << lease.reason;
}

// Behind a booking with a fractional end (a ledger written before windows were whole seconds):
// the earliest start is the next whole second.
TEST(Booking, EarliestStartIsAWholeSecondAfterAFractionalEnd) {
  const std::vector<Device> devs = {Device{1, "n1", "cpu", 0, "cpu", int64_t(8) << 30, ""}};
  const std::vector<Busy> busy = {Busy{1, 7, kT0, kT0 + 3600.43, 3, "bob", false}};
  const SlotAnswer a = find_slot(devs, busy, SlotRequest{1, "", 0, kT0 + 0.2, kH, 3, false});
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.start, kT0 + 3601);
  const SlotAnswer b = find_slot(devs, {}, SlotRequest{1, "", 0, kT0 + 0.2, kH, 3, false});
  EXPECT_EQ(b.start, kT0 + 1);
}

// With --preempt a lower-priority booking does not block: the refusal names only what does (it
// listed the P3 booking the request would have preempted beside the P1 one in its way).
TEST_F(LedgerTest, APreemptingRequestIsBlockedOnlyByWhatItCannotPreempt) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  ASSERT_TRUE(l->reserve(req(1, kT0, 2, 3, "alice")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0, 1, 1, "bob")).booked);
  ReserveRequest q = req(2, kT0, 1, 1, "root");
  q.preempt = true;
  const BookingResult r = l->reserve(q);
  ASSERT_FALSE(r.booked);
  EXPECT_DOUBLE_EQ(r.earliest_start, kT0 + kH);
  ASSERT_EQ(r.blockers.size(), 1u);
  EXPECT_EQ(r.blockers[0].owner, "bob");
}

TEST_F(LedgerTest, EarliestStartNamesBlockersAndFewestHosts) {
  auto l = open();
  l->register_devices(slots("a", 2));
  l->register_devices(slots("b", 4));
  const BookingResult first = l->reserve(req(3, kT0, 2, 2, "bob"));
  ASSERT_TRUE(first.booked);
  std::set<std::string> hosts;
  for (const Device& d : first.reservations[0].devices) hosts.insert(d.host);
  EXPECT_EQ(hosts, std::set<std::string>{"b"}) << "3 devices fit on one host";
  const BookingResult r = l->reserve(req(4, kT0 + kH, 1));
  ASSERT_FALSE(r.booked);
  EXPECT_DOUBLE_EQ(r.earliest_start, kT0 + 2 * kH);
  ASSERT_FALSE(r.blockers.empty());
  EXPECT_EQ(r.blockers[0].owner, "bob");
  EXPECT_EQ(r.blockers[0].priority, 2);
  ReserveRequest e = req(4, kT0 + kH, 1);
  e.start.reset();  // --start earliest
  const BookingResult b = l->reserve(e);
  ASSERT_TRUE(b.booked);
  EXPECT_DOUBLE_EQ(b.reservations[0].start, kT0 + 2 * kH);
}

// With victims alike, preemption takes the devices on the hosts of the free devices it already
// took, so a job spans as few hosts as it can: host b's device would win on index alone.
TEST(Booking, PreemptionPrefersTheHostsOfTheFreeDevicesTaken) {
  const std::vector<Device> devs = {Device{1, "a", "gpu", 0, "H100", 80, ""},
                                    Device{2, "a", "gpu", 1, "H100", 80, ""},
                                    Device{3, "b", "gpu", 0, "H100", 80, ""}};
  const std::vector<Busy> busy = {Busy{2, 10, 0, 100, 3, "x"}, Busy{3, 11, 0, 100, 3, "y"}};
  SlotRequest q;
  q.count = 2;
  q.start = 0;
  q.duration_s = 50;
  q.priority = 0;
  q.preempt = true;
  const SlotAnswer a = find_slot(devs, busy, q);
  ASSERT_TRUE(a.found);
  EXPECT_DOUBLE_EQ(a.start, 0);
  EXPECT_EQ(a.devices, (std::vector<int64_t>{1, 2}));
  ASSERT_EQ(a.preempted.size(), 1u);
  EXPECT_EQ(a.preempted[0].reservation, 10);
  // The preference is the hosts passed in: with none, the lowest index wins the tie.
  std::vector<const Device*> preemptible = {&devs[1], &devs[2]};
  EXPECT_EQ(choose_least_preemption(preemptible, busy, 0, 50, 1, {}), (std::vector<int64_t>{3}));
  EXPECT_EQ(choose_least_preemption(preemptible, busy, 0, 50, 1, {"a"}), (std::vector<int64_t>{2}));
  // The host preference comes after the victims: a running booking on host a is spared.
  std::vector<Busy> running = busy;
  running[0].running = true;
  EXPECT_EQ(choose_least_preemption(preemptible, running, 0, 50, 1, {"a"}),
            (std::vector<int64_t>{3}));
}

TEST(Booking, EarliestStartEqualsBruteForceOnSmallLedgers) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<Device> devs;
    const int ndev = 1 + int(rng() % 4);
    for (int i = 0; i < ndev; ++i) devs.push_back(Device{i + 1, i < 2 ? "a" : "b", "cpu", i,
                                                         "cpu", 1, ""});
    std::vector<Busy> busy;
    const int nb = int(rng() % 7);
    for (int k = 0; k < nb; ++k) {
      const int64_t dev = 1 + int64_t(rng() % ndev);
      const double s = double(rng() % 40), len = double(1 + rng() % 10);
      bool clash = false;
      for (const Busy& b : busy) clash = clash || (b.device == dev && b.start < s + len && s < b.end);
      if (!clash) busy.push_back(Busy{dev, k + 1, s, s + len, 1, "x"});
    }
    SlotRequest q;
    q.count = 1 + int64_t(rng() % ndev);
    q.start = double(rng() % 30);
    q.duration_s = double(1 + rng() % 8);
    const SlotAnswer a = find_slot(devs, busy, q);
    double brute = -1;
    for (double t = q.start; brute < 0; t += 1) {
      int64_t free = 0;
      for (const Device& d : devs) {
        bool taken = false;
        for (const Busy& b : busy) taken = taken || (b.device == d.id && b.start < t + q.duration_s && t < b.end);
        free += !taken;
      }
      if (free >= q.count) brute = t;
    }
    ASSERT_TRUE(a.found);
    ASSERT_DOUBLE_EQ(a.start, brute) << "trial " << trial;
    ASSERT_EQ(int64_t(a.devices.size()), q.count);
    for (int64_t id : a.devices) {
      for (const Busy& b : busy) {
        ASSERT_FALSE(b.device == id && b.start < a.start + q.duration_s && a.start < b.end);
      }
    }
  }
}

TEST_F(LedgerTest, PrioritiesAndPreemption) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  ASSERT_TRUE(l->reserve(req(2, kT0, 4, 2, "bob")).booked);  // P2, id 1
  // A higher priority does not take bookings without --preempt: refused with the earliest start.
  BookingResult r = l->reserve(req(2, kT0 + kH, 1, 0, "urgent"));
  EXPECT_FALSE(r.booked);
  EXPECT_DOUBLE_EQ(r.earliest_start, kT0 + 4 * kH);
  // --preempt needs the policy's permission.
  ReserveRequest p = req(2, kT0 + kH, 1, 0, "carol");
  p.preempt = true;
  test::expect_error([&] { l->reserve(p); }, {"carol may not preempt"});
  // A lower priority never preempts a higher one.
  p = req(2, kT0 + kH, 1, 3, "urgent");
  p.preempt = true;
  EXPECT_FALSE(l->reserve(p).booked);
  // Allowed: the P2 booking (not running) becomes preempted.
  p = req(2, kT0 + kH, 1, 0, "urgent");
  p.preempt = true;
  r = l->reserve(p);
  ASSERT_TRUE(r.booked);
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(l->reservation(1).state, "preempted");
  EXPECT_EQ(l->reservation(1).preempted_by, r.reservations[0].id);
  EXPECT_EQ(overlaps(), 0);
  // The P0 limit (1 per owner by default).
  EXPECT_FALSE(l->reserve(req(1, kT0 + 10 * kH, 1, 0, "urgent")).booked);
}

// Preemption breaks as little as it can: a booking once broken is broken whole, so its other
// devices are taken first; then bookings nobody is running, of the lowest priority.
TEST_F(LedgerTest, PreemptionBreaksTheFewestLowestPriorityBookingsAndSparesRunningOnes) {
  auto l = open();
  l->register_devices(slots("n1", 4));
  now_ = kT0;
  ASSERT_TRUE(l->reserve(req(1, kT0, 8, 3, "alice")).booked);  // 1: device 0, running below
  ASSERT_TRUE(l->reserve(req(1, kT0, 8, 2, "bob")).booked);    // 2: device 1
  ASSERT_TRUE(l->reserve(req(2, kT0, 8, 3, "carol")).booked);  // 3: devices 2 and 3
  ASSERT_TRUE(l->acquire_lease(1, "alice", "n1", 100, 60).ok);
  ReserveRequest p = req(2, kT0, 2, 0, "admin");
  p.preempt = true;
  const BookingResult r = l->reserve(p);
  ASSERT_TRUE(r.booked) << r.reason;
  ASSERT_EQ(r.preempted.size(), 1u);  // carol's two devices, not alice's and bob's one each
  EXPECT_EQ(r.preempted[0].id, 3);
  EXPECT_DOUBLE_EQ(r.reservations[0].start, kT0);  // no running holder's notice to wait for
  EXPECT_EQ(l->reservation(1).state, "active");
  EXPECT_EQ(l->reservation(2).state, "active");
  EXPECT_EQ(l->reservation(3).state, "preempted");
  // carol's launch is told who took her booking and what to do (it said only "is preempted")
  const LeaseResult refused = l->acquire_lease(3, "carol", "n1", 300, 60);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.reason,
            "reservation 3 is preempted by reservation 4 of admin (P0): book again with `berth "
            "reserve` (`--start earliest` takes the first free window) and train under the new "
            "booking with --resume auto");
  // One device more: alice's P3 is running, so bob's P2 (not running) is the one preempted.
  ReserveRequest q = req(1, kT0, 2, 1, "urgent");
  q.preempt = true;
  const BookingResult r2 = l->reserve(q);
  ASSERT_TRUE(r2.booked) << r2.reason;
  ASSERT_EQ(r2.preempted.size(), 1u);
  EXPECT_EQ(r2.preempted[0].id, 2);
  EXPECT_DOUBLE_EQ(r2.reservations[0].start, kT0);
  EXPECT_EQ(l->reservation(1).state, "active");
  EXPECT_DOUBLE_EQ(l->reservation(1).end, kT0 + 8 * kH);
  EXPECT_EQ(overlaps(), 0);
}

TEST_F(LedgerTest, PreemptionTakesOneBookingOfTwoDevicesOverTwoOfOne) {
  // Z (P2) on slot 0, Y (P3) on slot 1, X (P3) on slots 2 and 3, none running. Two devices for a
  // P1: X alone frees both. Device by device, the choice took slot 1 (Y, P3) and then slot 2,
  // breaking Y and X.
  auto l = open();
  l->register_devices(slots("n1", 4));
  ASSERT_TRUE(l->reserve(req(1, kT0, 2, 2, "zoe")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0, 2, 3, "yan")).booked);
  ASSERT_TRUE(l->reserve(req(2, kT0, 2, 3, "xia")).booked);
  ReserveRequest p = req(2, kT0, 1, 1, "urgent");
  p.preempt = true;
  const BookingResult r = l->reserve(p);
  ASSERT_TRUE(r.booked) << r.reason;
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0].id, 3);
  EXPECT_EQ(l->reservation(2).state, "active");
  EXPECT_EQ(overlaps(), 0);
}

TEST_F(LedgerTest, PreemptingARunningHolderLeavesTheMinimumNotice) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 8, 3, "bob")).booked);
  now_ = kT0 + kH;
  ASSERT_TRUE(l->acquire_lease(1, "bob", "n1", 100, 60).ok);
  ReserveRequest p = req(1, kT0 + kH, 2, 1, "admin");
  p.preempt = true;
  const BookingResult now = l->reserve(p);  // asked for now: refused, saying why
  ASSERT_FALSE(now.booked);
  EXPECT_DOUBLE_EQ(now.earliest_start, now_ + 600);
  EXPECT_TRUE(now.earliest_moves) << "now + the notice: --start earliest books it, that time not";
  EXPECT_NE(now.reason.find("reservation 1 is running there and gets the policy's min_notice_s "
                            "(10m00s) before it is preempted"),
            std::string::npos)
      << now.reason;
  p.start.reset();  // as soon as possible
  const BookingResult r = l->reserve(p);
  ASSERT_TRUE(r.booked);
  EXPECT_DOUBLE_EQ(r.reservations[0].start, now_ + 600);  // policy min_notice_s
  const Reservation old = l->reservation(1);
  EXPECT_EQ(old.state, "active");
  EXPECT_DOUBLE_EQ(old.end, now_ + 600) << "the running holder's window ends at the new start";
  const LeaseResult renewed = l->renew_lease(1, 1, 60);
  ASSERT_TRUE(renewed.ok);
  EXPECT_DOUBLE_EQ(renewed.lease.window_end, now_ + 600) << "the holder learns it at renewal";
  EXPECT_EQ(renewed.lease.window_note, " by reservation 2 of admin (P1)") << "and who cut it";
  EXPECT_EQ(overlaps(), 0);
}

// A training run's heartbeat renewed its lease in a ledger file removed (or replaced) since it
// opened it: nobody else reads that file, so a new ledger at the path could book the devices.
TEST_F(LedgerTest, ARenewalRefusesALedgerFileRemovedOrReplacedSinceItWasOpened) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 1, 3, "bob")).booked);
  ASSERT_TRUE(l->acquire_lease(1, "bob", "n1", 100, 60).ok);
  ASSERT_TRUE(l->renew_lease(1, 1, 60).ok);
  const std::string away = path_ + ".away";
  std::filesystem::rename(path_, away);
  test::expect_error([&] { l->renew_lease(1, 1, 60); },
                     {"the ledger " + path_ + " was removed after this process opened it",
                      "put the ledger file back"});
  {  // a new ledger, moved where it was
    auto other = open_sqlite_ledger(path_ + ".new", options());
    other->register_devices(slots("n1", 1));
  }
  std::filesystem::rename(path_ + ".new", path_);
  test::expect_error([&] { l->renew_lease(1, 1, 60); },
                     {"the ledger " + path_ + " was replaced by another file"});
  std::filesystem::remove(path_);
  std::filesystem::rename(away, path_);  // put back: the lease goes on
  EXPECT_TRUE(l->renew_lease(1, 1, 60).ok);
}

TEST_F(LedgerTest, ThePreemptionNoticeIsWeighedAgainstDevicesThatNeedNoCut) {
  // slot 0: bob's P3 hour, running; slot 1: carol's P1 five minutes. A P1 preemptor's earliest
  // start is carol's end (no cut), not now + min_notice_s on bob's slot (it was offered that).
  auto l = open();
  l->register_devices(slots("n1", 2));
  ASSERT_TRUE(l->reserve(req(1, kT0, 1, 3, "bob")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0, 300.0 / kH, 1, "carol")).booked);
  ASSERT_TRUE(l->acquire_lease(1, "bob", "n1", 100, 60).ok);
  ReserveRequest p = req(1, kT0, 0.5, 1, "urgent");
  p.preempt = true;
  const BookingResult refused = l->reserve(p);
  ASSERT_FALSE(refused.booked);
  EXPECT_DOUBLE_EQ(refused.earliest_start, kT0 + 300);
  EXPECT_FALSE(refused.earliest_moves) << "carol's end is a fixed time";
  p.start.reset();
  const BookingResult r = l->reserve(p);
  ASSERT_TRUE(r.booked);
  EXPECT_DOUBLE_EQ(r.reservations[0].start, kT0 + 300);
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_DOUBLE_EQ(l->reservation(1).end, kT0 + kH) << "bob's run is not cut";
  EXPECT_EQ(overlaps(), 0);
}

TEST_F(LedgerTest, ALeaseTakenEarlyWaitsForTheDevicesRunningHolder) {
  // alice's P2 hour runs on the slot; bob's P3 booking starts at its end. Within start_slack_s
  // of that start bob's launch took the lease while alice still trained: two jobs on one device.
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 1, 2, "alice")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH, 1, 3, "bob")).booked);
  ASSERT_TRUE(l->acquire_lease(1, "alice", "n1", 100, 2 * kH).ok);  // (renewed all along)
  now_ = kT0 + kH - 100;  // within the 300 s start slack of bob's window
  const LeaseResult early = l->acquire_lease(2, "bob", "n2", 200, 60);
  ASSERT_FALSE(early.ok);
  EXPECT_NE(early.reason.find("its device n1:cpu0 still runs reservation 1's job (pid 100 on n1)"),
            std::string::npos)
      << early.reason;
  EXPECT_NE(early.reason.find("launch again once that job has stopped"), std::string::npos);
  // Stopped (or crashed, and relaunching), alice's window is still hers: bob still waits, or
  // alice's relaunch would find her device taken for the rest of her window.
  l->release_lease(1, 1);
  const LeaseResult stopped = l->acquire_lease(2, "bob", "n2", 200, 60);
  ASSERT_FALSE(stopped.ok);
  EXPECT_NE(stopped.reason.find("its device n1:cpu0 is reservation 1's until 2026-12-03T21:00:00Z: "
                                "a lease is taken early only on devices no booking holds; launch "
                                "again at the window's start"),
            std::string::npos)
      << stopped.reason;
  EXPECT_TRUE(l->acquire_lease(1, "alice", "n1", 101, 60).ok);
  l->release_lease(1, 2);
  now_ = kT0 + kH;  // bob's window opens
  EXPECT_TRUE(l->acquire_lease(2, "bob", "n2", 200, 60).ok);
}

TEST_F(LedgerTest, AnEarlyLeaseWaitsForAnotherOwnersBookingInTheMinutesBeforeItsWindow) {
  // carol booked [T-200 s, T-100 s) on the slot, bob [T, T+1h). At T-300 s (start slack) bob's
  // early job would run through carol's window, and her launch would then be refused.
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH, 1, 3, "bob")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH - 200, 100.0 / kH, 3, "carol")).booked);
  now_ = kT0 + kH - 300;
  const LeaseResult early = l->acquire_lease(1, "bob", "n1", 100, 60);
  ASSERT_FALSE(early.ok);
  EXPECT_NE(early.reason.find("is reservation 2's until"), std::string::npos) << early.reason;
  now_ = kT0 + kH - 200;
  EXPECT_TRUE(l->acquire_lease(2, "carol", "n1", 200, 60).ok);
  EXPECT_EQ(overlaps(), 0);
}

TEST_F(LedgerTest, ACancelledBookingsRunningJobStillHoldsItsDevice) {
  // Cancelled while its job trains: the job stops at its next renewal, but a booking made at once
  // on the slot was leased meanwhile (two live leases on one device).
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 1, 3, "root")).booked);
  ASSERT_TRUE(l->acquire_lease(1, "root", "n1", 100, 300).ok);
  l->cancel(1, "root");
  ASSERT_TRUE(l->reserve(req(1, kT0, 0.5, 3, "nobody")).booked);
  const LeaseResult second = l->acquire_lease(2, "nobody", "n2", 200, 60);
  ASSERT_FALSE(second.ok);
  EXPECT_NE(second.reason.find("still runs reservation 1's job (pid 100 on n1)"), std::string::npos)
      << second.reason;
  ASSERT_TRUE(second.held_by.has_value());  // the lease in the way, for a relaunch that may wait
  EXPECT_EQ(second.held_by->reservation, 1);
  EXPECT_EQ(second.held_by->pid, 100);
  EXPECT_EQ(second.held_by->host, "n1");
  l->release_lease(1, 1);  // the job saw the cancellation at its renewal and stopped
  EXPECT_TRUE(l->acquire_lease(2, "nobody", "n2", 200, 60).ok);
}

TEST_F(LedgerTest, AnEarlyLeaseWaitsForTheOwnersOwnBookingThatHasNotBegun) {
  // alice's short booking C in the slack minutes before her booking R: R's early job would run
  // through C's window, and C's launch would then be refused.
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH, 1)).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH - 100, 100.0 / kH)).booked);
  now_ = kT0 + kH - 300;
  EXPECT_FALSE(l->acquire_lease(1, "alice", "n1", 100, 60).ok);
  now_ = kT0 + kH - 100;
  EXPECT_TRUE(l->acquire_lease(2, "alice", "n1", 101, 60).ok);
}

TEST_F(LedgerTest, TheOwnersNextBookingIsTakenEarlyOnceTheBookingBeforeStopped) {
  // The run of segment 1 stopped before its window's end (its stop reserve, exit 3); its batch
  // script resumes under segment 2 at once: the same run goes on, on the same devices. (So with
  // two bookings of one owner back to back.)
  auto l = open();
  l->register_devices(slots("n1", 1));
  ReserveRequest q = req(1, kT0, 8 * 24);
  q.allow_split = true;
  const BookingResult split = l->reserve(q);
  ASSERT_TRUE(split.booked);
  ASSERT_EQ(split.reservations.size(), 2u);
  const int64_t first = split.reservations[0].id, second = split.reservations[1].id;
  ASSERT_TRUE(l->acquire_lease(first, "alice", "n1", 100, 8 * 24 * kH).ok);
  now_ = split.reservations[1].start - 120;
  EXPECT_FALSE(l->acquire_lease(second, "alice", "n1", 101, 60).ok) << "segment 1 still runs";
  l->release_lease(first, 1);
  EXPECT_TRUE(l->acquire_lease(second, "alice", "n1", 101, 60).ok);
  // Her job under segment 1 relaunched meanwhile (its window is still open): the device is
  // segment 2's job's now, not two jobs'.
  const LeaseResult twice = l->acquire_lease(first, "alice", "n1", 102, 60);
  ASSERT_FALSE(twice.ok);
  EXPECT_NE(twice.reason.find("still runs reservation 2's job (pid 101 on n1): a device is leased "
                              "to one job at a time; launch again once that job has stopped"),
            std::string::npos)
      << twice.reason;
}

TEST_F(LedgerTest, AHolderThatTookItsLeaseEarlyIsCutNotBrokenAndHoldsItsDevicesFromNow) {
  // bob's window starts in 100 s; his job took the lease now (start slack). A preemption kept the
  // notice but broke his booking whole: the run lost its lease with no checkpoint (exit 4).
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0 + 100, 1, 3, "bob")).booked);
  ASSERT_TRUE(l->acquire_lease(1, "bob", "n1", 100, 60).ok);
  // Nobody books into the 100 s before his window either: the device is his from now.
  const BookingResult gap = l->reserve(req(1, kT0, 60.0 / kH, 3, "carol"));
  ASSERT_FALSE(gap.booked);
  EXPECT_DOUBLE_EQ(gap.earliest_start, kT0 + 100 + kH);
  ReserveRequest p = req(1, kT0, 0.5, 0, "urgent");
  p.preempt = true;
  p.start.reset();
  const BookingResult r = l->reserve(p);
  ASSERT_TRUE(r.booked);
  EXPECT_DOUBLE_EQ(r.reservations[0].start, kT0 + 600);  // min_notice_s
  const Reservation cut = l->reservation(1);
  EXPECT_EQ(cut.state, "active");
  EXPECT_DOUBLE_EQ(cut.start, kT0);
  EXPECT_DOUBLE_EQ(cut.end, kT0 + 600);
  const LeaseResult renewed = l->renew_lease(1, 1, 60);
  ASSERT_TRUE(renewed.ok);
  EXPECT_DOUBLE_EQ(renewed.lease.window_end, kT0 + 600);
  EXPECT_EQ(overlaps(), 0);
}

TEST_F(LedgerTest, LongerThanSevenDaysIsSplitOnlyWhenAllowed) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ReserveRequest q = req(1, kT0, 9 * 24);
  BookingResult r = l->reserve(q);
  EXPECT_FALSE(r.booked);
  ASSERT_EQ(r.proposed_split.size(), 2u);
  EXPECT_DOUBLE_EQ(r.proposed_split[0].second - r.proposed_split[0].first, kMaxSegmentS);
  EXPECT_EQ(rows("reservations"), 0);
  // One second over: the rounded "7d00h" alone read as if the limit were wrong.
  ReserveRequest over = q;
  over.duration_s = kMaxSegmentS + 1;
  EXPECT_NE(l->reserve(over).reason.find(
                "7d00h (604801 s) is longer than the 7-day limit of one booking (604800 s)"),
            std::string::npos);
  q.allow_split = true;
  r = l->reserve(q);
  ASSERT_TRUE(r.booked);
  ASSERT_EQ(r.reservations.size(), 2u);
  EXPECT_EQ(r.reservations[1].chain_prev, r.reservations[0].id);
  EXPECT_DOUBLE_EQ(r.reservations[1].start, r.reservations[0].end);
  EXPECT_DOUBLE_EQ(r.reservations[1].end, kT0 + 9 * 86400);
}

TEST_F(LedgerTest, MalformedRequestsGetSpecificErrorsAndNoRows) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  auto bad = [&](ReserveRequest q, const std::string& msg) {
    test::expect_error([&] { l->reserve(q); }, {msg});
    EXPECT_EQ(rows("reservations"), 0) << msg;
    EXPECT_EQ(rows("booked"), 0) << msg;
  };
  bad(req(0, kT0, 1), "--gpus must be between 1 and 4096, got 0");
  bad(req(-3, kT0, 1), "got -3");
  bad(req(5000, kT0, 1), "got 5000");
  bad(req(3, kT0, 1), "3 device(s) requested but only 2 match");
  bad(req(1, kT0, 0), "--duration must be at least 1s");
  bad(req(1, kT0, -2), "--duration must be at least 1s");
  bad(req(1, kT0 + kH, 1e-7 / kH), "--duration must be at least 1s");  // booked no window at all
  bad(req(1, kT0 - kH, 1), "is in the past");
  // a mistyped year (9999 for 2026) is refused by the policy's horizon, not booked
  bad(req(1, kT0 + 400 * 86400.0, 1), "this ledger books at most 366d00h ahead (policy");
  ReserveRequest q = req(1, kT0, 1);
  q.model = "H100";
  bad(q, "unknown model 'H100': the ledger's devices are cpu");
  q = req(1, kT0, 1);
  q.name = std::string(65, 'x');
  bad(q, "--name is 65 characters; at most 64");
  q = req(1, kT0, 1);
  q.name = "bad\nname";
  bad(q, "--name must be printable UTF-8 text");
  // Invalid UTF-8 was stored, then broke every --json listing of the ledger.
  for (const char* text : {"x\xff", "\xc3", "\xc0\xaf", "\xed\xa0\x80",
                           "a\xc2\x85"
                           "b",
                           // right-to-left override, first-strong isolate, line separator
                           "evil\xe2\x80\xaetxt.exe", "\xe2\x81\xa8x", "a\xe2\x80\xa8"}) {
    q = req(1, kT0, 1);
    q.name = text;
    bad(q, "--name must be printable UTF-8 text");
    q = req(1, kT0, 1);
    q.idempotency_key = text;
    bad(q, "--idempotency-key must be printable UTF-8 text");
  }
  q = req(1, kT0, 1);
  q.name.clear();
  for (int i = 0; i < 65; ++i) q.name += "\xc3\xa9";  // é: characters, not bytes, count
  bad(q, "--name is 65 characters; at most 64");
  q = req(1, kT0, 1);
  q.priority = 4;
  bad(q, "priority must be P0..P3");
  q = req(1, kT0, 1);
  q.min_free_mem_bytes = int64_t(9) << 30;
  bad(q, "only 0 match");
  test::expect_error([] { parse_priority("P7"); }, {"use P0 (highest)"});
  test::expect_error([] { parse_duration("3 days"); }, {"in the duration '3 days'"});
  test::expect_error([] { parse_duration("12x"); }, {"unknown unit 'x'"});
  test::expect_error([] { parse_duration("abc"); }, {"cannot read the duration"});
  test::expect_error([] { parse_bytes("75GiBs"); }, {"unknown unit 'GiBs'"});
  test::expect_error([] { parse_duration("1h1h"); }, {"repeats a unit", "1d12h or 1h30m"});
  test::expect_error([] { parse_duration("30m1h"); }, {"repeats a unit"});
  test::expect_error([] { parse_duration("99999999999999999999h"); }, {"longer than 10 years"});
  test::expect_error([] { parse_bytes("1e30GiB"); }, {"larger than an exabyte"});
  // Only plain decimal: stod read hexadecimal (0x10h = 16 h), "inf" and a leading blank.
  test::expect_error([] { parse_duration("0x10h"); }, {"unknown unit 'x' in the duration '0x10h'"});
  test::expect_error([] { parse_duration("infh"); }, {"cannot read the duration 'infh'"});
  test::expect_error([] { parse_duration(" 1h"); }, {"cannot read the duration ' 1h'"});
  test::expect_error([] { parse_duration("1e400h"); }, {"cannot read the duration '1e400h'"});
  test::expect_error([] { parse_bytes("0x1GiB"); }, {"unknown unit 'x1GiB' in the size '0x1GiB'"});
  test::expect_error([] { parse_bytes("+1GiB"); }, {"cannot read the size '+1GiB'"});
  EXPECT_DOUBLE_EQ(parse_duration(".5h"), 1800);
  EXPECT_DOUBLE_EQ(parse_duration("1.5e1m"), 900);
  EXPECT_EQ(parse_bytes("2e0GiB"), 2147483648);
  EXPECT_DOUBLE_EQ(parse_duration("1d12h30m15s"), 131415);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("2d"), 172800);
  EXPECT_EQ(parse_bytes("75GiB"), int64_t(75) << 30);
  EXPECT_EQ(parse_bytes("80GB"), int64_t(80000000000));
  EXPECT_TRUE(l->reserve(req(1, kT0 + 365 * 86400.0, 1)).booked) << "within the horizon";
  q = req(1, kT0 + 2 * kH, 1);
  q.name.clear();
  for (int i = 0; i < 64; ++i) q.name += "\xc3\xa9";
  const BookingResult accented = l->reserve(q);
  ASSERT_TRUE(accented.booked) << accented.reason;
  EXPECT_EQ(accented.reservations.front().name, q.name);
  test::expect_error([&] { l->extend(accented.reservations.front().id, 1e-9, "alice"); },
                     {"--by must be at least 1s"});
  // A device model with a terminal escape could never be booked by --model, and printed raw.
  std::vector<Device> odd = slots("n2", 1, "X\x1b[2J");
  test::expect_error([&] { l->register_devices(odd); },
                     {"device n2:cpu0: its model must be 1..64 characters of printable UTF-8"});
}

TEST_F(LedgerTest, OnlyOwnerOrAdminCancelsOrExtends) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 2, 3, "alice")).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0 + 3 * kH, 2, 3, "bob")).booked);
  test::expect_error([&] { l->cancel(1, "bob"); }, {"bob may not cancel reservation 1", "alice"});
  test::expect_error([&] { l->extend(1, kH, "bob"); }, {"bob may not extend"});
  EXPECT_EQ(l->extend(1, kH, "alice").end, kT0 + 3 * kH) << "touching bob's booking is fine";
  test::expect_error([&] { l->extend(1, 60, "alice"); },
                     {"booked from its end", "reservation 2 (bob, P3)",
                      "so no extension is possible"});  // not "--by 0s", which --by refuses
  EXPECT_EQ(l->cancel(2, "admin").state, "cancelled");
  test::expect_error([&] { l->cancel(2, "bob"); }, {"already cancelled"});
  test::expect_error([&] { l->reservation(99); }, {"no reservation 99"});
}

TEST_F(LedgerTest, IdempotentRetryReturnsTheSameBooking) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  ReserveRequest q = req(1, kT0, 2);
  q.idempotency_key = "job-42";
  const BookingResult a = l->reserve(q);
  const BookingResult b = l->reserve(q);
  ASSERT_TRUE(a.booked && b.booked);
  EXPECT_TRUE(b.replayed);
  EXPECT_EQ(a.reservations[0].id, b.reservations[0].id);
  EXPECT_EQ(rows("reservations"), 1);
  q.count = 2;
  test::expect_error([&] { l->reserve(q); }, {"idempotency key 'job-42' was already used"});
}

// A retry repeats the request, not the booking as it is now: after an extension it still
// replays (it was refused as "a different request", and the extended length replayed as if
// asked). A split booking replays only while every segment is booked: with one cancelled the
// replay printed its id among the booked ones; the refusal names each segment's state.
TEST_F(LedgerTest, AnIdempotentRetryRepeatsTheRequestAndNeedsEverySegment) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  ReserveRequest q = req(1, kT0, 1);
  q.idempotency_key = "job42";
  const int64_t id = l->reserve(q).reservations.at(0).id;
  l->extend(id, 1800, "alice");
  const BookingResult again = l->reserve(q);
  ASSERT_TRUE(again.booked && again.replayed);
  EXPECT_EQ(again.reservations.at(0).id, id);
  EXPECT_DOUBLE_EQ(again.reservations.at(0).end, kT0 + 1.5 * kH);
  ReserveRequest longer = q;
  longer.duration_s = 1.5 * kH;  // never asked for
  test::expect_error([&] { l->reserve(longer); }, {"idempotency key 'job42' was already used"});

  ReserveRequest split = req(1, kT0 + 2 * kH, 8 * 24);
  split.allow_split = true;
  split.idempotency_key = "s1";
  const BookingResult b = l->reserve(split);
  ASSERT_EQ(b.reservations.size(), 2u);
  const int64_t first = b.reservations[0].id, second = b.reservations[1].id;
  l->cancel(second, "alice");
  test::expect_error(
      [&] { l->reserve(split); },
      {fmt::format("idempotency key 's1' belongs to reservation {} (its segment {}), "
                   "which is cancelled",
                   first, second),
       fmt::format("(its segments: {} active, {} cancelled)", first, second)});
}

TEST_F(LedgerTest, AnIdempotentRetryReplaysAfterItsStartHasPassed) {
  // A start 30 s ago (within past_slack_s) books from now: its retry was "a different request",
  // and a retry after the start had passed was refused as a start in the past.
  auto l = open();
  l->register_devices(slots("n1", 1));
  now_ = kT0 + 30.5;
  ReserveRequest q = req(1, kT0, 2);
  q.idempotency_key = "nightly";
  const BookingResult a = l->reserve(q);
  ASSERT_TRUE(a.booked);
  EXPECT_DOUBLE_EQ(a.reservations[0].start, kT0 + 30);
  now_ = kT0 + 33;
  const BookingResult b = l->reserve(q);
  ASSERT_TRUE(b.booked && b.replayed);
  EXPECT_EQ(b.reservations[0].id, a.reservations[0].id);
  now_ = kT0 + kH;  // long past the start
  const BookingResult c = l->reserve(q);
  ASSERT_TRUE(c.booked && c.replayed);
  EXPECT_EQ(rows("reservations"), 1);
  // Another request under the key is refused as such, after the request's own checks.
  // A replay is no way around the request's checks, nor for a start older than the booking.
  ReserveRequest short_one = q;
  short_one.duration_s = 0.5;
  test::expect_error([&] { l->reserve(short_one); }, {"--duration must be at least 1s"});
  ReserveRequest ancient = q;
  ancient.start = kT0 - 24 * kH;
  test::expect_error([&] { l->reserve(ancient); }, {"--start", "is in the past"});
  q.count = 3;
  test::expect_error([&] { l->reserve(q); }, {"--start", "is in the past"});
  q.start = now_ + 60;
  test::expect_error([&] { l->reserve(q); }, {"idempotency key 'nightly' was already used"});
}

TEST_F(LedgerTest, ASplitP0BookingCountsOnceAgainstTheLimitWhichIsNamed) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ReserveRequest q = req(1, kT0, 8 * 24, 0, "urgent");
  q.allow_split = true;
  const BookingResult split = l->reserve(q);
  ASSERT_TRUE(split.booked);
  EXPECT_EQ(split.reservations.size(), 2u);
  const BookingResult more = l->reserve(req(1, kT0 + 9 * 24 * kH, 1, 0, "urgent"));
  ASSERT_FALSE(more.booked);
  EXPECT_NE(more.reason.find("urgent already holds 1 active P0 booking(s), and the ledger's "
                             "policy allows 1 (max_p0_per_owner)"),
            std::string::npos)
      << more.reason;
}

TEST_F(LedgerTest, TheEarliestStartKeepsToTheBookingHorizon) {
  // max_advance_s refused an explicit --start past it but booked an earliest start past it,
  // and a refusal offered a start that was then refused.
  LedgerOptions o = options();
  o.policy.max_advance_s = kH;
  auto l = open_sqlite_ledger(path_, o);
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0, 2)).booked);
  for (const bool earliest : {true, false}) {
    ReserveRequest q = req(1, kT0 + 10, 1);
    if (earliest) q.start.reset();
    const BookingResult r = l->reserve(q);
    ASSERT_FALSE(r.booked);
    EXPECT_EQ(r.earliest_start, 0) << "no start offered that could not be booked";
    EXPECT_NE(r.reason.find("the earliest feasible start, 2026-12-03T22:00:00Z, is 2h00m ahead, "
                            "past the 1h00m this ledger books ahead"),
              std::string::npos)
        << r.reason;
  }
  EXPECT_EQ(rows("reservations"), 1);
}

TEST_F(LedgerTest, LeaseTokensOnlyGrow) {
  auto l = open();
  l->register_devices(slots("n1", 1));
  ASSERT_TRUE(l->reserve(req(1, kT0 + kH, 4)).booked);
  LeaseResult a = l->acquire_lease(1, "alice", "n1", 10, 60);
  EXPECT_FALSE(a.ok);
  EXPECT_NE(a.reason.find("window opens at"), std::string::npos) << a.reason;
  now_ = kT0 + kH - 100;  // within the start slack
  // Only the owner (or an admin) trains on a booking: another user's launch is refused, and the
  // refusal issues no token.
  const LeaseResult foreign = l->acquire_lease(1, "mallory", "n1", 9, 60);
  EXPECT_FALSE(foreign.ok);
  EXPECT_NE(foreign.reason.find("reservation 1 belongs to alice, and mallory may not train on it"),
            std::string::npos)
      << foreign.reason;
  EXPECT_FALSE(l->lease(1).has_value());
  a = l->acquire_lease(1, "alice", "n1", 10, 60);
  ASSERT_TRUE(a.ok);
  const LeaseResult second = l->acquire_lease(1, "alice", "n2", 11, 60);
  EXPECT_FALSE(second.ok);
  EXPECT_NE(second.reason.find("already held by pid 10 on n1"), std::string::npos) << second.reason;
  // the holder, for a relaunch that may wait for a dead one's lease to lapse (lease_keeper.cpp)
  ASSERT_TRUE(second.held_by.has_value());
  EXPECT_EQ(second.held_by->pid, 10);
  EXPECT_EQ(second.held_by->host, "n1");
  now_ += 30;
  EXPECT_TRUE(l->renew_lease(1, a.lease.token, 60).ok);
  now_ += 61;  // the holder stops renewing: the lease lapses, the booking survives
  EXPECT_FALSE(l->renew_lease(1, a.lease.token, 60).ok);
  const LeaseResult b = l->acquire_lease(1, "alice", "n1", 12, 60);
  ASSERT_TRUE(b.ok);
  EXPECT_GT(b.lease.token, a.lease.token);
  const LeaseResult stale = l->renew_lease(1, a.lease.token, 60);
  EXPECT_FALSE(stale.ok);
  EXPECT_NE(stale.reason.find("another launch took it over"), std::string::npos) << stale.reason;
  l->release_lease(1, b.lease.token);
  l->release_lease(1, b.lease.token);  // idempotent
  EXPECT_FALSE(l->renew_lease(1, b.lease.token, 60).ok);
  const LeaseResult by_admin = l->acquire_lease(1, "admin", "n1", 14, 60);  // e.g. to drain it
  ASSERT_TRUE(by_admin.ok) << by_admin.reason;
  l->release_lease(1, by_admin.lease.token);
  EXPECT_EQ(l->reservation(1).state, "active");
  now_ = kT0 + 5 * kH;
  EXPECT_NE(l->acquire_lease(1, "alice", "n1", 13, 60).reason.find("window ended"),
            std::string::npos);
}

// A renewal after the window's end is refused and says so (window_over): the holder may still
// stop with a checkpoint, since nobody can take the lease then, even once its TTL has passed.
// Refusals for any other reason do not say so.
TEST_F(LedgerTest, ARenewalAfterTheWindowSaysTheWindowIsOver) {
  auto l = open();
  l->register_devices(slots("n1", 2));
  ASSERT_TRUE(l->reserve(req(1, kT0, 1)).booked);
  ASSERT_TRUE(l->reserve(req(1, kT0, 1)).booked);
  const LeaseResult a = l->acquire_lease(1, "alice", "n1", 10, 2 * kH);
  const LeaseResult b = l->acquire_lease(2, "alice", "n1", 11, 2 * kH);
  ASSERT_TRUE(a.ok && b.ok);
  now_ = kT0 + kH - 30;
  const LeaseResult before = l->renew_lease(1, a.lease.token, 60);
  EXPECT_TRUE(before.ok && !before.window_over);
  now_ = kT0 + kH;  // the end, within the TTL
  LeaseResult over = l->renew_lease(1, a.lease.token, 60);
  EXPECT_FALSE(over.ok);
  EXPECT_TRUE(over.window_over);
  EXPECT_NE(over.reason.find("reservation 1's window ended at"), std::string::npos) << over.reason;
  EXPECT_EQ(over.lease.window_end, kT0 + kH);  // the end as the ledger has it (a cut included)
  EXPECT_EQ(over.lease.token, a.lease.token);
  now_ = kT0 + kH + 600;  // and past the TTL: still nobody else's
  over = l->renew_lease(1, a.lease.token, 60);
  EXPECT_TRUE(!over.ok && over.window_over);
  EXPECT_FALSE(l->acquire_lease(1, "alice", "n1", 12, 60).ok);
  EXPECT_TRUE(l->renew_lease(1, a.lease.token, 60).window_over);
  // A lease that lapsed before its window ended is expired, not window_over: anyone could have
  // taken it in between.
  ASSERT_TRUE(l->reserve(req(1, kT0 + 2 * kH, 1)).booked);  // reservation 3
  now_ = kT0 + 2 * kH;
  const LeaseResult c = l->acquire_lease(3, "alice", "n1", 12, 60);
  ASSERT_TRUE(c.ok) << c.reason;
  now_ = kT0 + 3 * kH + 10;
  const LeaseResult lapsed = l->renew_lease(3, c.lease.token, 60);
  EXPECT_FALSE(lapsed.ok || lapsed.window_over);
  EXPECT_NE(lapsed.reason.find("expired at"), std::string::npos) << lapsed.reason;
  // Not the window: a stale token, a released lease, a cancelled booking.
  EXPECT_FALSE(l->renew_lease(1, a.lease.token + 100, 60).window_over);
  l->release_lease(1, a.lease.token);
  EXPECT_FALSE(l->renew_lease(1, a.lease.token, 60).window_over);
  l->cancel(2, "alice");
  const LeaseResult cancelled = l->renew_lease(2, b.lease.token, 60);
  EXPECT_FALSE(cancelled.ok || cancelled.window_over);
  EXPECT_NE(cancelled.reason.find("reservation 2 was cancelled"), std::string::npos)
      << cancelled.reason;
}

TEST_F(LedgerTest, SchemaMigratesUpAndRefusesDowngradeAndForeignFiles) {
  {  // a version-1 ledger with a booking in it, as an older berth wrote it
    LedgerOptions o = options();
    o.migrate_to = 1;
    auto l = open_sqlite_ledger(path_, o);
    EXPECT_EQ(l->schema_version(), 1);
    l->register_devices(slots("n1", 1));
  }
  {
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    ASSERT_EQ(sqlite3_exec(db,
                           "INSERT INTO reservations(name, owner, priority, start, end, state, "
                           "created, model, min_free_mem) VALUES('old', 'alice', 3, 1796328000, "
                           "1796331600, 'active', 1796328000, '', 0); INSERT INTO booked "
                           "VALUES(1, 1);",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  {
    auto l = open();
    EXPECT_EQ(l->schema_version(), kLedgerSchemaVersion);
    EXPECT_EQ(l->reservation(1).owner, "alice");
    EXPECT_EQ(l->reservation(1).preempted_by, 0);
  }
  {
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  test::expect_error([&] { open(); }, {"schema version 99, newer than this berth understands"});
  // A negative version indexed before the migrations: garbage run as SQL, or a crash.
  for (const char* v : {"PRAGMA user_version=-1", "PRAGMA user_version=-100000"}) {
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    sqlite3_exec(db, v, nullptr, nullptr, nullptr);
    sqlite3_close(db);
    test::expect_error([&] { open(); }, {"which no berth writes: it is not a berth ledger"});
  }
  const std::string other = (dir_ / "other.db").string();
  {
    sqlite3* db = nullptr;
    sqlite3_open(other.c_str(), &db);
    sqlite3_exec(db, "CREATE TABLE t(x)", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  test::expect_error([&] { open_sqlite_ledger(other, options()); }, {"not a berth ledger"});
  write_file_atomic((dir_ / "text.db").string(), "hello, this is not sqlite at all\n");
  test::expect_error([&] { open_sqlite_ledger((dir_ / "text.db").string(), options()); },
                     {"not a berth ledger"});
  // A ledger cut short (a full disk, a partial copy): named as a damaged ledger with what to do,
  // not only SQLite's "database disk image is malformed".
  const std::string cut = (dir_ / "cut.db").string();
  {
    auto l = open_sqlite_ledger(cut, options());
    for (int h = 0; h < 40; ++h) l->register_devices(slots("host" + std::to_string(h), 8));
  }
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) / 2);
  test::expect_error([&] { open_sqlite_ledger(cut, options())->devices(); },
                     {"cut.db is damaged", "database disk image is malformed", "put back a backup",
                      "cut.db' .recover | sqlite3 '"});
}

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void sql(const std::string& path, const char* statements) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, statements, nullptr, nullptr, nullptr), SQLITE_OK) << statements;
  sqlite3_close(db);
}
std::string journal_mode(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, nullptr);
  sqlite3_step(s);
  const std::string mode = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
  sqlite3_finalize(s);
  sqlite3_close(db);
  return mode;
}
}  // namespace

// Opening reads before it writes: a foreign database named by mistake was switched to WAL mode
// (or given the ledger's tables) before it was refused, and every open took the write lock (a
// listing waited out a stuck writer, then failed).
TEST_F(LedgerTest, OpeningWritesNothingBeforeItKnowsTheFileAndAReaderWaitsForNoWriter) {
  const std::string other = (dir_ / "other.db").string();
  sql(other, "CREATE TABLE t(x); INSERT INTO t VALUES(1);");
  const std::string other_bytes = file_bytes(other);
  test::expect_error([&] { open_sqlite_ledger(other, options()); }, {"not a berth ledger"});
  EXPECT_EQ(file_bytes(other), other_bytes) << "the refused database was changed";
  const std::string empty = (dir_ / "empty.db").string();  // SQLite, no tables
  sql(empty, "CREATE TABLE t(x); DROP TABLE t;");
  const std::string empty_bytes = file_bytes(empty);
  LedgerOptions no_create = options();
  no_create.create = false;  // every command but `devices register`
  test::expect_error([&] { open_sqlite_ledger(empty, no_create); },
                     {"SQLite database with no berth tables", "berth devices register"});
  EXPECT_EQ(file_bytes(empty), empty_bytes) << "a listing made it a ledger";

  {
    auto l = open();
    l->register_devices(slots("n1", 1));
    ASSERT_TRUE(l->reserve(req(1, kT0, 1)).booked);
  }
  sqlite3* writer = nullptr;  // a writer stuck inside its transaction
  ASSERT_EQ(sqlite3_open(path_.c_str(), &writer), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(writer, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  no_create.busy_timeout_s = 2;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(open_sqlite_ledger(path_, no_create)->reservations(true, "").size(), 1u);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // ... while a booking waits for it, and says why when the wait is over
  no_create.busy_timeout_s = 0.2;
  test::expect_error([&] { open_sqlite_ledger(path_, no_create)->reserve(req(1, kT0 + kH, 1)); },
                     {"stayed locked by another process"});
  sqlite3_exec(writer, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(writer);
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "ledger.db" || name == "other.db" || name == "empty.db")
        << name << " was left beside the ledgers";
  }
  EXPECT_EQ(journal_mode(path_), "wal");
}

// A user who may read the ledger but not write it is refused before SQLite opens it: the -wal and
// -shm files it made, owned by itself with the ledger's mode 0644, locked the owner out of every
// command (`berth reservations` as nobody, then the owner's `berth reserve` failed).
TEST_F(LedgerTest, AUserWhoCannotWriteTheLedgerIsRefusedAndLeavesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a child as another user";
  open()->register_devices(slots("n1", 1));
  std::filesystem::permissions(dir_,
                               std::filesystem::perms::all | std::filesystem::perms::sticky_bit);
  std::filesystem::permissions(path_, std::filesystem::perms(0644));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 3;
    if (::setgid(65534) == 0 && ::setuid(65534) == 0) {
      try {
        LedgerOptions o;
        o.create = false;
        open_sqlite_ledger(path_, o)->reservations(true, "");
        code = 1;  // read it
      } catch (const Error& e) {
        code = std::string(e.what()).find("cannot be written by this process (uid 65534)") !=
                       std::string::npos
                   ? 0
                   : 2;
      }
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: read it; 2: another error; 3: could not drop root";
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string(), "ledger.db") << "left beside the ledger";
  }
  EXPECT_EQ(open()->devices().size(), 1u) << "the owner is locked out";
}

// SQLite reports damage only where a statement reads it: a ledger with overwritten pages was
// listed and booked on.
TEST_F(LedgerTest, ALedgerWithADamagedPageIsRefusedOnOpen) {
  {
    auto l = open();
    for (int h = 0; h < 40; ++h) l->register_devices(slots("host" + std::to_string(h), 8));
  }
  const auto size = std::filesystem::file_size(path_);
  ASSERT_GE(size, 4u * 4096);
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size / 4096 / 2) * 4096);  // a page in the middle, from its header
    const std::string garbage(512, '\xab');
    f.write(garbage.data(), std::streamsize(garbage.size()));
  }
  LedgerOptions no_create = options();
  no_create.create = false;
  test::expect_error([&] { open_sqlite_ledger(path_, no_create); },
                     {"ledger.db is damaged", "put back a backup"});
}

// A new ledger takes the umask, as other files do (SQLite makes 0644 whatever the umask): a
// group-writable directory and umask 002 give a ledger its group can book on.
TEST_F(LedgerTest, ANewLedgerTakesTheUmask) {
  const mode_t before = ::umask(002);
  open()->register_devices(slots("n1", 1));
  ::umask(before);
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0664u);
}

TEST(Ledger, NetworkFilesystemsAreNamed) {
  EXPECT_EQ(network_filesystem_name(0x6969), "NFS");
  EXPECT_EQ(network_filesystem_name(0xFF534D42), "CIFS");
  EXPECT_EQ(network_filesystem_name(0xEF53), "");  // ext4
  EXPECT_EQ(network_filesystem_name(0x01021994), "");  // tmpfs
}

TEST_F(LedgerTest, ThirtyTwoProcessesRaceForTheLastWindowExactlyOneWins) {
  {
    auto l = open();
    l->register_devices(slots("n1", 2));
    ASSERT_TRUE(l->reserve(req(1, kT0, 24)).booked);  // one slot left for today
  }
  constexpr int kProcs = 32;
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 3;
      try {
        auto l = open_sqlite_ledger(path_, options());
        const BookingResult r = l->reserve(req(1, kT0 + kH, 4, 3, "p" + std::to_string(i)));
        code = r.booked ? 0 : (r.earliest_start == kT0 + 5 * kH ? 1 : 2);
      } catch (...) {
        code = 4;
      }
      _exit(code);
    }
    kids.push_back(pid);
  }
  int won = 0, told_earliest = 0, other = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    won += code == 0;
    told_earliest += code == 1;
    other += code != 0 && code != 1;
  }
  EXPECT_EQ(won, 1);
  EXPECT_EQ(told_earliest, kProcs - 1);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(overlaps(), 0);
  EXPECT_EQ(rows("reservations"), 2);
}

TEST_F(LedgerTest, BookerKilledInsideItsTransactionLeavesNothing) {
  {
    auto l = open();
    l->register_devices(slots("n1", 2));
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    LedgerOptions o = options();
    o.pause_in_transaction_s = 30;  // holds the write transaction until killed
    try {
      open_sqlite_ledger(path_, o)->reserve(req(2, kT0, 1));
    } catch (...) {
    }
    _exit(0);
  }
  usleep(1500 * 1000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto l = open();
  EXPECT_EQ(l->reservations(true, "").size(), 0u);
  EXPECT_EQ(rows("booked"), 0);
  EXPECT_TRUE(l->reserve(req(2, kT0, 1)).booked) << "the ledger is usable after the kill";
}

TEST_F(LedgerTest, PolicyAndInventoryFiles) {
  const std::string pol = (dir_ / "p.toml").string();
  write_file_atomic(pol,
                    "admins = [\"ops\"]\npreemptors = [\"urgent\"]\nmax_p0_per_owner = 2\n"
                    "max_advance_s = 3600\n");
  const PolicyFile p = read_policy_file(pol);
  EXPECT_EQ(p.admins, std::vector<std::string>{"ops"});
  EXPECT_EQ(p.max_p0_per_owner, 2);
  EXPECT_EQ(p.max_advance_s, 3600);
  write_file_atomic(pol, "admin = [\"ops\"]\n");
  test::expect_error([&] { read_policy_file(pol); }, {"unknown key 'admin'"});
  const std::string inv = (dir_ / "c.toml").string();
  write_file_atomic(inv, "[[hosts]]\nname = \"node01\"\nmodel = \"H100\"\nmemory_gib = 80\n"
                         "gpus = 8\n");
  ASSERT_EQ(read_cluster_inventory(inv).size(), 1u);
  EXPECT_EQ(read_cluster_inventory(inv)[0].count, 8);
  write_file_atomic(inv, "[[hosts]]\nname = \"node01\"\nmodel = \"H100\"\nmemory_gib = 80\n"
                         "gpus = 0\n");
  test::expect_error([&] { read_cluster_inventory(inv); }, {"'gpus' must be an integer in 1..4096"});
}

}  // namespace
}  // namespace berth
