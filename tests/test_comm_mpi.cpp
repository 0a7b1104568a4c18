// MpiCommunicator under mpirun -np 2, 3 and 4 (ctest label "mpi"): every collective, grouped and
// ungrouped point-to-point, split, barrier, stats and the error paths.
//
// Inputs are small integers (in float too), so every reduction is exact in any order and results
// are compared with == (STYLE.md rule 13). Every test runs on every rank and calls the same
// collectives in the same order; checks that could differ between ranks come after the
// collectives, never between them, so a failing rank reports instead of leaving peers hanging.
// Only rank 0 prints gtest's usual output; other ranks print their own failures with their rank.
// The exit code is non-zero on every rank when any rank failed.
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/check_mpi.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/check.h"
#include "tests/expect_error.h"
#include "tests/mpi_world.h"

namespace berth::detail {
// Defined in runtime/comm/mpi.cpp: the largest element count per MPI call (INT_MAX); lowered here
// to exercise the chunked paths with small buffers. Returns the previous value.
size_t set_mpi_max_count_for_testing(size_t max_count);
}  // namespace berth::detail

namespace berth {
namespace {

using test::world;

// ---- helpers ---------------------------------------------------------------------------------

// The input of rank r at index i: small integers, exact in float; 64-bit types use 2^40 steps so
// the upper bits are exercised too.
template <typename T>
T val(int r, size_t i) {
  if constexpr (sizeof(T) == 8) {
    return static_cast<T>(r) * static_cast<T>(int64_t{1} << 40) + static_cast<T>(i % 1000);
  } else {
    return static_cast<T>(r * 1000 + static_cast<int>(i % 1000));
  }
}

// The exact expected reduction over all ranks of val(., i).
template <typename T>
T reduced(ReduceOp op, int n, size_t i) {
  if (op == ReduceOp::MAX) return val<T>(n - 1, i);
  T s = 0;
  for (int q = 0; q < n; ++q) s += val<T>(q, i);
  return op == ReduceOp::AVG ? s / static_cast<T>(n) : s;
}

// == elementwise; one failure naming the first mismatch and how many there are.
template <typename T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i]) && bad++ == 0) first = i;
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << got.size() << " elements differ; first at ["
                  << first << "]: got " << +got[first] << ", want " << +want[first];
  }
}

std::string label(const char* what, size_t count, ReduceOp op, bool in_place) {
  const char* ops[] = {"SUM", "AVG", "MAX"};
  return fmt::format("{} count={} op={} {} np={}", what, count, ops[static_cast<int>(op)],
                     in_place ? "in-place" : "out-of-place", world().size());
}

// Restores the MPI count limit at scope exit.
struct MaxCountGuard {
  explicit MaxCountGuard(size_t n) : old(detail::set_mpi_max_count_for_testing(n)) {}
  ~MaxCountGuard() { detail::set_mpi_max_count_for_testing(old); }
  size_t old;
};

// ---- dtype -----------------------------------------------------------------------------------

TEST(CommMpi, DtypeSize) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_of<float>(), DType::F32);
  EXPECT_EQ(dtype_of<int64_t>(), DType::I64);
  EXPECT_THROW(dtype_size(static_cast<DType>(99)), Error);
}

TEST(CommMpi, WorldRankAndSize) {
  int r = -1, n = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  EXPECT_EQ(world().rank(), r);
  EXPECT_EQ(world().size(), n);
  EXPECT_GE(n, 2) << "run under mpirun -np 2 or more";
}

// ---- all_reduce ------------------------------------------------------------------------------

template <typename T>
void check_all_reduce(size_t count, ReduceOp op, bool in_place) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  std::vector<T> send(count), recv(count + 1, T(-7));  // recv[count]: must stay untouched
  for (size_t i = 0; i < count; ++i) send[i] = val<T>(r, i);
  const std::vector<T> send_before = send;
  if (in_place) {
    c.all_reduce(send.data(), send.data(), count, dtype_of<T>(), op);
  } else {
    c.all_reduce(send.data(), recv.data(), count, dtype_of<T>(), op);
  }
  std::vector<T> want(count);
  for (size_t i = 0; i < count; ++i) want[i] = reduced<T>(op, n, i);
  if (in_place) {
    expect_same(send, want, label("all_reduce", count, op, true));
  } else {
    expect_same(std::vector<T>(recv.begin(), recv.begin() + count), want,
                label("all_reduce", count, op, false));
    EXPECT_EQ(recv[count], T(-7)) << "all_reduce wrote past count";
    expect_same(send, send_before, "all_reduce changed its out-of-place send buffer");
  }
}

template <typename T>
void check_all_reduce_all(std::initializer_list<ReduceOp> ops) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}})
    for (ReduceOp op : ops)
      for (bool in_place : {false, true}) check_all_reduce<T>(count, op, in_place);
}

TEST(CommMpi, AllReduceF32) {
  check_all_reduce_all<float>({ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX});
}
TEST(CommMpi, AllReduceF64) {
  check_all_reduce_all<double>({ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX});
}
TEST(CommMpi, AllReduceI32) { check_all_reduce_all<int32_t>({ReduceOp::SUM, ReduceOp::MAX}); }
TEST(CommMpi, AllReduceI64) { check_all_reduce_all<int64_t>({ReduceOp::SUM, ReduceOp::MAX}); }

TEST(CommMpi, AllReduceU8) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  std::vector<uint8_t> sum(9), mx(9);
  for (size_t i = 0; i < 9; ++i) sum[i] = mx[i] = static_cast<uint8_t>(r * 10 + i);
  c.all_reduce(sum.data(), 9, ReduceOp::SUM);
  c.all_reduce(mx.data(), 9, ReduceOp::MAX);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(sum[i], 10 * n * (n - 1) / 2 + n * static_cast<int>(i)) << i;
    EXPECT_EQ(mx[i], (n - 1) * 10 + static_cast<int>(i)) << i;
  }
}

TEST(CommMpi, AllReduceZeroCountWithNullBuffers) {
  world().all_reduce(nullptr, nullptr, 0, DType::F32, ReduceOp::SUM);
  float x = 5.f;
  world().all_reduce(&x, &x, 0, DType::F32, ReduceOp::AVG);
  EXPECT_EQ(x, 5.f);
}

TEST(CommMpi, AllReduceValueAndIntegerAvgIsAnError) {
  Communicator& c = world();
  const int n = c.size();
  EXPECT_EQ(c.all_reduce_value<int64_t>(c.rank() + 1, ReduceOp::SUM), int64_t{n} * (n + 1) / 2);
  EXPECT_EQ(c.all_reduce_value<double>(c.rank(), ReduceOp::MAX), n - 1.0);
  int32_t x = 1;
  test::expect_error([&] { c.all_reduce(&x, &x, 1, DType::I32, ReduceOp::AVG); },
                     {"AVG needs a floating-point dtype", "I32"});
  int64_t y = 1;
  EXPECT_THROW(c.all_reduce(&y, &y, 1, DType::I64, ReduceOp::AVG), Error);
}

// ---- reduce_scatter --------------------------------------------------------------------------

template <typename T>
void check_reduce_scatter(const std::vector<size_t>& counts, ReduceOp op) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  size_t total = 0, offset = 0;
  for (int q = 0; q < n; ++q) {
    if (q == r) offset = total;
    total += counts[q];
  }
  std::vector<T> send(total), recv(counts[r] + 1, T(-7));
  for (size_t g = 0; g < total; ++g) send[g] = val<T>(r, g);
  c.reduce_scatter(send.data(), recv.data(), counts, dtype_of<T>(), op);
  std::vector<T> want(counts[r]);
  for (size_t i = 0; i < counts[r]; ++i) want[i] = reduced<T>(op, n, offset + i);
  expect_same(std::vector<T>(recv.begin(), recv.begin() + counts[r]), want,
              fmt::format("reduce_scatter counts={} np={} rank={}", fmt::join(counts, ","), n, r));
  EXPECT_EQ(recv[counts[r]], T(-7)) << "reduce_scatter wrote past counts[rank]";
}

// Even, uneven with rank 1 at zero, one big block, all zero.
std::vector<std::vector<size_t>> scatter_patterns(int n) {
  std::vector<size_t> even(n, 5), uneven(n), big(n, 0), zero(n, 0);
  for (int q = 0; q < n; ++q) uneven[q] = q == 1 ? 0 : 2 * q + 3;
  big[n - 1] = 1001;
  big[0] = 1;
  return {even, uneven, big, zero};
}

TEST(CommMpi, ReduceScatter) {
  for (const auto& counts : scatter_patterns(world().size())) {
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
      check_reduce_scatter<float>(counts, op);
      check_reduce_scatter<double>(counts, op);
    }
    check_reduce_scatter<int32_t>(counts, ReduceOp::SUM);
    check_reduce_scatter<int64_t>(counts, ReduceOp::SUM);
    check_reduce_scatter<int64_t>(counts, ReduceOp::MAX);
  }
}

TEST(CommMpi, ReduceScatterZeroCountsWithNullBuffers) {
  world().reduce_scatter(nullptr, nullptr, std::vector<size_t>(world().size(), 0), DType::F32,
                         ReduceOp::SUM);
}

TEST(CommMpi, ReduceScatterErrors) {
  Communicator& c = world();
  std::vector<float> buf(4 * c.size());
  test::expect_error(
      [&] {
        c.reduce_scatter(buf.data(), buf.data() + 4 * c.size() - 1,
                         std::vector<size_t>(c.size() + 1, 1), DType::F32, ReduceOp::SUM);
      },
      {"counts has", "ranks"});
  test::expect_error(
      [&] {
        c.reduce_scatter(buf.data(), buf.data(), std::vector<size_t>(c.size(), 4), DType::F32,
                         ReduceOp::SUM);
      },
      {"not in-place"});
}

// ---- all_gather ------------------------------------------------------------------------------

template <typename T>
void check_all_gather(const std::vector<size_t>& counts, bool in_place) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  std::vector<size_t> offsets(n + 1, 0);
  for (int q = 0; q < n; ++q) offsets[q + 1] = offsets[q] + counts[q];
  const size_t total = offsets[n];
  std::vector<T> recv(total + 1, T(-7)), send(counts[r]);
  for (size_t i = 0; i < counts[r]; ++i) send[i] = val<T>(r, i);
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin() + offsets[r]);
    c.all_gather(recv.data() + offsets[r], recv.data(), counts, dtype_of<T>());
  } else {
    c.all_gather(send.data(), recv.data(), counts, dtype_of<T>());
  }
  std::vector<T> want;
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < counts[q]; ++i) want.push_back(val<T>(q, i));
  expect_same(std::vector<T>(recv.begin(), recv.begin() + total), want,
              fmt::format("all_gather counts={} {} np={}", fmt::join(counts, ","),
                          in_place ? "in-place" : "out-of-place", n));
  EXPECT_EQ(recv[total], T(-7)) << "all_gather wrote past Σ counts";
}

TEST(CommMpi, AllGather) {
  for (const auto& counts : scatter_patterns(world().size())) {
    for (bool in_place : {false, true}) {
      check_all_gather<float>(counts, in_place);
      check_all_gather<int64_t>(counts, in_place);
    }
    check_all_gather<double>(counts, false);
    check_all_gather<int32_t>(counts, true);
  }
}

TEST(CommMpi, AllGatherU8AndNullZero) {
  Communicator& c = world();
  const int n = c.size();
  std::vector<size_t> counts(n, 3);
  std::vector<uint8_t> send(3), recv(3 * n);
  for (int i = 0; i < 3; ++i) send[i] = static_cast<uint8_t>(c.rank() * 3 + i);
  c.all_gather(send.data(), recv.data(), counts, DType::U8);
  for (int i = 0; i < 3 * n; ++i) EXPECT_EQ(recv[i], i) << i;
  c.all_gather(nullptr, nullptr, std::vector<size_t>(n, 0), DType::U8);
}

TEST(CommMpi, AllGatherSendOverlappingAnotherBlockIsAnError) {
  Communicator& c = world();
  std::vector<float> recv(2 * c.size());
  // recv + 1 is never a rank's own block (blocks start at even offsets), so every rank throws.
  test::expect_error(
      [&] {
        c.all_gather(recv.data() + 1, recv.data(), std::vector<size_t>(c.size(), 2), DType::F32);
      },
      {"overlaps recv"});
}

// ---- broadcast -------------------------------------------------------------------------------

template <typename T>
void check_broadcast(size_t count) {
  Communicator& c = world();
  for (int root = 0; root < c.size(); ++root) {
    std::vector<T> buf(count + 1, T(-7));
    if (c.rank() == root)
      for (size_t i = 0; i < count; ++i) buf[i] = val<T>(root, i);
    c.broadcast(buf.data(), count, dtype_of<T>(), root);
    std::vector<T> want(count + 1, T(-7));
    for (size_t i = 0; i < count; ++i) want[i] = val<T>(root, i);
    expect_same(buf, want, fmt::format("broadcast count={} root={} np={}", count, root, c.size()));
  }
}

TEST(CommMpi, BroadcastFromEachRoot) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
    check_broadcast<float>(count);
    check_broadcast<int64_t>(count);
  }
  check_broadcast<double>(7);
  check_broadcast<int32_t>(7);
  world().broadcast(nullptr, 0, DType::U8, world().size() - 1);
  test::expect_error([&] { world().broadcast(nullptr, 0, DType::U8, world().size()); },
                     {"broadcast root", "not a rank"});
}

// ---- point-to-point --------------------------------------------------------------------------

// Every rank sends to the next and receives from the previous at once: rendezvous-sized messages
// (4 MiB), so blocking sends would all wait for a receive that is never posted.
TEST(CommMpi, RingExchangeInAGroup) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t count = size_t{1} << 20;
  std::vector<float> out(count), in(count, -1.f);
  for (size_t i = 0; i < count; ++i)
    out[i] = static_cast<float>(r * (1 << 21) + static_cast<int>(i));
  c.group_begin();
  c.send(out.data(), count, DType::F32, next);
  c.recv(in.data(), count, DType::F32, prev);
  c.group_end();
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i)
    want[i] = static_cast<float>(prev * (1 << 21) + static_cast<int>(i));
  expect_same(in, want, fmt::format("ring recv from {} np={}", prev, n));
}

// An asynchronous group: posted, computation runs on other buffers, wait() completes it; a
// collective or another group while it is in flight is an error naming wait().
TEST(CommMpi, AsyncGroupCompletesAtWaitAndGuardsItsWindow) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  const size_t count = size_t{1} << 18;
  std::vector<float> out(count, float(r)), in(count, -1.f), other(count, 0.f);
  c.group_begin();
  c.send(out.data(), count, DType::F32, next);
  c.recv(in.data(), count, DType::F32, prev);
  c.group_end_async();
  for (size_t i = 0; i < count; ++i) other[i] = float(i) * 0.5f;  // "computation"
  std::string msg;
  try {
    c.barrier();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("call wait() first"), std::string::npos) << msg;
  EXPECT_THROW(c.group_begin(), Error);
  c.wait();
  expect_same(in, std::vector<float>(count, float(prev)), "async ring recv");
  c.wait();  // nothing in flight: a no-op
  c.barrier();
}

// Several messages to one peer in one group arrive in the order they were posted, and recvs
// posted before their sends (in call order) also work.
TEST(CommMpi, GroupKeepsOrderPerPeer) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  std::vector<int64_t> a(5, val<int64_t>(r, 1)), b(3, val<int64_t>(r, 2)), x(5), y(3), z(1, 42);
  c.group_begin();
  c.recv(x.data(), 5, DType::I64, prev);
  c.send(a.data(), 5, DType::I64, next);
  c.send(b.data(), 3, DType::I64, next);
  c.recv(y.data(), 3, DType::I64, prev);
  c.send(nullptr, 0, DType::I64, next);
  c.recv(z.data(), 0, DType::I64, prev);
  c.group_end();
  expect_same(x, std::vector<int64_t>(5, val<int64_t>(prev, 1)), "first message");
  expect_same(y, std::vector<int64_t>(3, val<int64_t>(prev, 2)), "second message");
  EXPECT_EQ(z[0], 42) << "a zero-count recv wrote";
  c.group_begin();  // an empty group is fine
  c.group_end();
}

// A pipeline outside a group: rank r receives from r-1, then sends to r+1 (each call completes
// before it returns).
TEST(CommMpi, SendRecvOutsideAGroup) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  for (size_t count : {size_t{0}, size_t{7}, size_t{1} << 20}) {
    std::vector<double> in(count, -1.0), out(count);
    for (size_t i = 0; i < count; ++i) out[i] = val<double>(r, i);
    if (r > 0) c.recv(in.data(), count, DType::F64, r - 1);
    if (r < n - 1) c.send(out.data(), count, DType::F64, r + 1);
    if (r > 0) {
      std::vector<double> want(count);
      for (size_t i = 0; i < count; ++i) want[i] = val<double>(r - 1, i);
      expect_same(in, want, fmt::format("pipeline count={} rank={}", count, r));
    }
  }
}

TEST(CommMpi, GroupMisuseIsAnError) {
  Communicator& c = world();
  test::expect_error([&] { c.group_end(); }, {"group_end without a matching group_begin"});
  c.group_begin();
  test::expect_error([&] { c.group_begin(); }, {"nested groups"});
  float x = 0;
  test::expect_error([&] { c.all_reduce(&x, &x, 1, DType::F32, ReduceOp::SUM); },
                     {"all_reduce inside group_begin/group_end"});
  test::expect_error([&] { c.barrier(); }, {"barrier inside group_begin/group_end"});
  test::expect_error([&] { c.send(&x, 1, DType::F32, c.size()); }, {"send peer", "not a rank"});
  test::expect_error([&] { c.recv(&x, 1, DType::F32, -1); }, {"recv peer -1", "not a rank"});
  c.group_end();  // the outer group is still open and empty
  EXPECT_THROW(c.group_end(), Error);
  EXPECT_THROW(c.send(&x, 1, DType::F32, -1), Error);
}

// ---- MPI_CHECK -------------------------------------------------------------------------------

TEST(CommMpi, MpiCheckThrowsWithTheMpiMessageAndEvaluatesOnce) {
  int calls = 0, x = 0;
  const int bad_peer = world().size() + 5;
  auto bad_send = [&] {
    ++calls;
    return MPI_Send(&x, 1, MPI_INT, bad_peer, 0, MPI_COMM_WORLD);  // invalid rank
  };
  const int rc = bad_send();
  ASSERT_NE(rc, MPI_SUCCESS) << "MPI_COMM_WORLD should return errors (MPI_ERRORS_RETURN)";
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  calls = 0;
  test::expect_error(
      [&] { MPI_CHECK(bad_send()); },
      {"MPI error: ", std::string(text, len), "`bad_send()`", "test_comm_mpi.cpp:", identity()});
  EXPECT_EQ(calls, 1);
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // success does not throw
}

// ---- split -----------------------------------------------------------------------------------

// The world ranks of `sub`'s members in sub-rank order, via all_gather on `sub`.
std::vector<int32_t> members(Communicator& sub) {
  std::vector<int32_t> out(sub.size());
  const int32_t me = world().rank();
  sub.all_gather(&me, out.data(), std::vector<size_t>(sub.size(), 1), DType::I32);
  return out;
}

TEST(CommMpi, SplitEvenOdd) {
  const int r = world().rank(), n = world().size();
  std::unique_ptr<Communicator> sub = world().split(r % 2, r);
  ASSERT_NE(sub, nullptr);
  std::vector<int32_t> want;
  for (int q = r % 2; q < n; q += 2) want.push_back(q);
  EXPECT_EQ(sub->size(), static_cast<int>(want.size()));
  EXPECT_EQ(sub->rank(), r / 2);
  EXPECT_EQ(members(*sub), want);
  int64_t sum = 0;
  for (int32_t q : want) sum += val<int64_t>(q, 3);
  EXPECT_EQ(sub->all_reduce_value(val<int64_t>(r, 3), ReduceOp::SUM), sum);
  float f = static_cast<float>(r * 10);
  sub->broadcast(&f, 1, DType::F32, 0);
  EXPECT_EQ(f, static_cast<float>((r % 2) * 10));
  // a split of a split: singletons
  std::unique_ptr<Communicator> single = sub->split(sub->rank(), 0);
  ASSERT_NE(single, nullptr);
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->rank(), 0);
  EXPECT_EQ(single->all_reduce_value(2.5, ReduceOp::AVG), 2.5);
  sub->barrier();
}

TEST(CommMpi, SplitReversedKeyOrdersByKey) {
  const int r = world().rank(), n = world().size();
  std::unique_ptr<Communicator> sub = world().split(r % 2, n - r);
  ASSERT_NE(sub, nullptr);
  std::vector<int32_t> want;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) want.push_back(q);
  EXPECT_EQ(members(*sub), want);
  // equal keys: ordered by the parent rank
  std::unique_ptr<Communicator> same = world().split(0, 7);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->rank(), r);
  std::vector<int32_t> all(n);
  for (int q = 0; q < n; ++q) all[q] = q;
  EXPECT_EQ(members(*same), all);
}

TEST(CommMpi, SplitNegativeColorGivesNullptr) {
  const int r = world().rank(), n = world().size();
  std::unique_ptr<Communicator> sub = world().split(r == 0 ? -1 : 3, r);
  if (r == 0) {
    EXPECT_EQ(sub, nullptr);
    return;
  }
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), n - 1);
  EXPECT_EQ(sub->rank(), r - 1);
  std::vector<int32_t> want;
  for (int q = 1; q < n; ++q) want.push_back(q);
  EXPECT_EQ(members(*sub), want);
  std::vector<float> counts_sum(2, static_cast<float>(r));
  sub->all_reduce(counts_sum.data(), 2, ReduceOp::SUM);
  EXPECT_EQ(counts_sum[0], static_cast<float>(n * (n - 1) / 2));
}

// ---- barrier, stats, local rank --------------------------------------------------------------

// Rank 0 enters the barrier 200 ms late; no rank may leave it before rank 0 entered. The clock is
// CLOCK_MONOTONIC, shared by the processes of one host.
TEST(CommMpi, BarrierWaitsForTheLastRank) {
  Communicator& c = world();
  using clock = std::chrono::steady_clock;
  auto ns = [] {
    return static_cast<int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
            .count());
  };
  int64_t entered = 0;
  if (c.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    entered = ns();
  }
  c.barrier();
  const int64_t left = ns();
  c.broadcast(&entered, 1, DType::I64, 0);
  EXPECT_GE(left, entered) << "left the barrier before rank 0 entered it";
}

TEST(CommMpi, StatsCountPayloadBytesAndCalls) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size();
  c.reset_stats();
  std::vector<float> f(7 * n, 1.f), g(7 * n);
  c.all_reduce(f.data(), 7, ReduceOp::SUM);                                    // 28 B
  c.all_reduce(f.data(), 0, ReduceOp::SUM);                                    // 0 B, a call
  c.reduce_scatter(f.data(), g.data(), std::vector<size_t>(n, 7), DType::F32,  // 28n B
                   ReduceOp::SUM);
  c.all_gather(f.data(), g.data(), std::vector<size_t>(n, 7), DType::F32);  // 28n B
  double d = 1;
  c.broadcast(&d, 1, DType::F64, 0);  // 8 B
  c.group_begin();
  c.send(f.data(), 3, DType::F32, (r + 1) % n);      // 12 B
  c.recv(g.data(), 3, DType::F32, (r - 1 + n) % n);  // 12 B
  c.group_end();
  const CommStats& s = c.stats();
  EXPECT_EQ(s.all_reduce_bytes, 28);
  EXPECT_EQ(s.reduce_scatter_bytes, 28 * n);
  EXPECT_EQ(s.all_gather_bytes, 28 * n);
  EXPECT_EQ(s.broadcast_bytes, 8);
  EXPECT_EQ(s.send_bytes, 12);
  EXPECT_EQ(s.recv_bytes, 12);
  EXPECT_EQ(s.calls, 7);
  c.reset_stats();
  EXPECT_EQ(c.stats().calls, 0);
  EXPECT_EQ(c.stats().all_reduce_bytes, 0);
}

TEST(CommMpi, LocalRankOnOneHost) {
  const LocalRank lr = mpi_local_rank();
  EXPECT_EQ(lr.rank, world().rank());
  EXPECT_EQ(lr.size, world().size());
}

// ---- counts above the per-call limit ---------------------------------------------------------

// With the limit lowered to 7 elements, elementwise operations split into several MPI calls and
// still give exact results; reduce_scatter and all_gather refuse with the limit in the message.
TEST(CommMpi, CountsAboveTheLimitAreChunkedOrRefused) {
  Communicator& c = world();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  MaxCountGuard guard(7);
  for (size_t count : {size_t{7}, size_t{14}, size_t{1001}}) {
    for (bool in_place : {false, true}) check_all_reduce<float>(count, ReduceOp::AVG, in_place);
    check_all_reduce<int64_t>(count, ReduceOp::SUM, false);
    check_broadcast<int32_t>(count);
    std::vector<double> out(count), in(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = val<double>(r, i);
    c.group_begin();
    c.send(out.data(), count, DType::F64, next);
    c.recv(in.data(), count, DType::F64, prev);
    c.group_end();
    std::vector<double> want(count);
    for (size_t i = 0; i < count; ++i) want[i] = val<double>(prev, i);
    expect_same(in, want, fmt::format("chunked ring count={}", count));
  }
  std::vector<size_t> small(n, 0);
  small[0] = 7;
  check_reduce_scatter<float>(small, ReduceOp::SUM);  // exactly at the limit
  check_all_gather<float>(small, true);
  std::vector<size_t> counts(n, 4);  // total 4n > 7
  std::vector<float> f(4 * n), g(4 * n);
  test::expect_error(
      [&] { c.reduce_scatter(f.data(), g.data(), counts, DType::F32, ReduceOp::SUM); },
      {"reduce_scatter", "exceed the MPI count limit of 7"});
  test::expect_error([&] { c.all_gather(f.data(), g.data(), counts, DType::F32); },
                     {"all_gather", "exceed the MPI count limit of 7"});
}

}  // namespace
}  // namespace berth

