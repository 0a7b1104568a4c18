// MpiCommunicator: the Communicator over an MPI communicator, host buffers (see communicator.h).
//
// Every call is blocking. Element counts travel to MPI as int: all_reduce, broadcast and send/recv
// split a count above the limit (INT_MAX elements) into several MPI calls, which is exact since
// they are elementwise; reduce_scatter and all_gather need every count and offset as an int and
// throw a berth::Error naming the limit instead. Zero counts go through MPI with a valid dummy
// buffer wherever the caller's pointer is null.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/comm/call_timer.h"
#include "runtime/comm/check_mpi.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/watchdog.h"
#include "runtime/core/check.h"

namespace berth {

namespace detail {
namespace {
size_t g_max_count = static_cast<size_t>(INT_MAX);
}  // namespace

// The largest element count handed to one MPI call (INT_MAX). Tests lower it to exercise the
// chunked paths with small buffers; every rank must use the same value. Returns the old value.
size_t set_mpi_max_count_for_testing(size_t max_count) {
  BERTH_CHECK(max_count >= 1 && max_count <= static_cast<size_t>(INT_MAX),
              "max_count {} must be in [1, INT_MAX]", max_count);
  return std::exchange(g_max_count, max_count);
}
}  // namespace detail

namespace {

// ---- mapping ---------------------------------------------------------------------------------

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  BERTH_FAIL("unknown DType value {}", static_cast<int>(t));
}

// AVG is a SUM followed by a division on the calling rank (identical on every rank).
MPI_Op mpi_op(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::AVG:
      BERTH_CHECK(t == DType::F32 || t == DType::F64,
                  "ReduceOp::AVG needs a floating-point dtype, got {}; reduce with SUM and divide",
                  dtype_name(t));
      return MPI_SUM;
  }
  BERTH_FAIL("unknown ReduceOp value {}", static_cast<int>(op));
}

void divide_by(void* buf, size_t count, DType t, int n) {
  if (t == DType::F32) {
    float* p = static_cast<float*>(buf);
    const float d = static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) p[i] /= d;
  } else {
    double* p = static_cast<double*>(buf);
    const double d = static_cast<double>(n);
    for (size_t i = 0; i < count; ++i) p[i] /= d;
  }
}

// A valid address for zero-count MPI calls whose caller passed nullptr.
alignas(16) unsigned char g_dummy[16];
void* or_dummy(void* p) { return p ? p : g_dummy; }
const void* or_dummy(const void* p) { return p ? p : g_dummy; }

// The limit for counts that cannot be chunked (reduce_scatter, all_gather).
int as_int_count(size_t n, const char* what) {
  BERTH_CHECK(n <= detail::g_max_count,
              "{}: {} elements exceed the MPI count limit of {} per call (MPI counts are int); "
              "split the buffer into smaller buckets",
              what, n, detail::g_max_count);
  return static_cast<int>(n);
}

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// A send or recv queued between group_begin and group_end.
struct P2pOp {
  bool is_send;
  void* buf;
  size_t count;
  DType dtype;
  int peer;
};

// ---- the communicator ------------------------------------------------------------------------

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) when `owned`; MPI_COMM_WORLD never is.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  ~MpiCommunicator() override {
    if (!owned_ || comm_ == MPI_COMM_NULL || comm_ == MPI_COMM_WORLD) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // a destructor cannot throw; a failure here is moot
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("all_reduce", count * dtype_size(dtype), size_);
    not_in_group("all_reduce");
    const MPI_Op mop = mpi_op(op, dtype);
    const MPI_Datatype mtype = mpi_type(dtype);
    const size_t ds = dtype_size(dtype);
    const bool in_place = send == recv;
    size_t done = 0;
    do {  // at least one call, so a zero count still goes through MPI like on every other rank
      const size_t n = std::min(detail::g_max_count, count - done);
      void* r = recv ? static_cast<char*>(recv) + done * ds : nullptr;
      const void* s = in_place
                          ? MPI_IN_PLACE
                          : or_dummy(send ? static_cast<const char*>(send) + done * ds : nullptr);
      MPI_CHECK(MPI_Allreduce(s, or_dummy(r), static_cast<int>(n), mtype, mop, comm_));
      done += n;
    } while (done < count);
    if (op == ReduceOp::AVG) divide_by(recv, count, dtype, size_);
    count_bytes(stats_.all_reduce_bytes, count, dtype);
  }

  void reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                      ReduceOp op) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("reduce_scatter", sum(counts) * dtype_size(dtype), size_);
    not_in_group("reduce_scatter");
    const std::vector<int> icounts = int_counts(counts, "reduce_scatter");
    const MPI_Op mop = mpi_op(op, dtype);
    const size_t ds = dtype_size(dtype), total = sum(counts), mine = counts[rank_];
    BERTH_CHECK(!ranges_overlap(send, total * ds, recv, mine * ds),
                "reduce_scatter is not in-place: recv must not overlap send");
    MPI_CHECK(MPI_Reduce_scatter(or_dummy(send), or_dummy(recv), icounts.data(), mpi_type(dtype),
                                 mop, comm_));
    if (op == ReduceOp::AVG) divide_by(recv, mine, dtype, size_);
    count_bytes(stats_.reduce_scatter_bytes, total, dtype);
  }

  void all_gather(const void* send, void* recv, const std::vector<size_t>& counts,
                  DType dtype) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("all_gather", sum(counts) * dtype_size(dtype), size_);
    not_in_group("all_gather");
    const std::vector<int> icounts = int_counts(counts, "all_gather");
    std::vector<int> displs(counts.size());
    for (size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + icounts[r - 1];
    const size_t ds = dtype_size(dtype), total = sum(counts), mine = counts[rank_];
    const char* my_block = recv ? static_cast<const char*>(recv) + displs[rank_] * ds : nullptr;
    const bool in_place = send == my_block;
    BERTH_CHECK(in_place || !ranges_overlap(send, mine * ds, recv, total * ds),
                "all_gather: send overlaps recv but is not this rank's block (offset {} elements); "
                "pass recv + offset for in-place or a separate buffer",
                displs[rank_]);
    const MPI_Datatype mtype = mpi_type(dtype);
    MPI_CHECK(MPI_Allgatherv(in_place ? MPI_IN_PLACE : or_dummy(send), icounts[rank_], mtype,
                             or_dummy(recv), icounts.data(), displs.data(), mtype, comm_));
    count_bytes(stats_.all_gather_bytes, total, dtype);
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("broadcast", count * dtype_size(dtype), size_);
    not_in_group("broadcast");
    BERTH_CHECK(root >= 0 && root < size_,
                "broadcast root {} is not a rank of this group (size {})", root, size_);
    const MPI_Datatype mtype = mpi_type(dtype);
    const size_t ds = dtype_size(dtype);
    size_t done = 0;
    do {
      const size_t n = std::min(detail::g_max_count, count - done);
      void* b = buf ? static_cast<char*>(buf) + done * ds : nullptr;
      MPI_CHECK(MPI_Bcast(or_dummy(b), static_cast<int>(n), mtype, root, comm_));
      done += n;
    } while (done < count);
    count_bytes(stats_.broadcast_bytes, count, dtype);
  }

  // ---- point-to-point --------------------------------------------------------------------------

  void group_begin() override {
    BERTH_CHECK(in_flight_.empty(), "group_begin while an asynchronous group is in flight: call "
                "wait() first");
    BERTH_CHECK(!in_group_,
                "group_begin inside an open group (nested groups are not supported); "
                "call group_end first");
    in_group_ = true;
  }

  void group_end() override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("send/recv group", p2p_bytes(pending_), size_);
    BERTH_CHECK(in_group_, "group_end without a matching group_begin");
    in_group_ = false;
    std::vector<P2pOp> ops;
    ops.swap(pending_);
    run_p2p(ops);
  }

  void group_end_async() override {
    const CallTimer timer(&stats_.seconds);
    BERTH_CHECK(in_group_, "group_end_async without a matching group_begin");
    in_group_ = false;
    std::vector<P2pOp> ops;
    ops.swap(pending_);
    in_flight_ = post_p2p(ops);
  }

  void wait() override {
    const CallTimer timer(&stats_.seconds);
    if (in_flight_.empty()) return;
    const WatchedCall watch("wait for a send/recv group", 0, size_);
    std::vector<MPI_Request> reqs;
    reqs.swap(in_flight_);
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }

  void send(const void* buf, size_t count, DType dtype, int peer) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("send", count * dtype_size(dtype), size_);
    p2p(P2pOp{true, const_cast<void*>(buf), count, dtype, peer});
    count_bytes(stats_.send_bytes, count, dtype);
  }

  void recv(void* buf, size_t count, DType dtype, int peer) override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("recv", count * dtype_size(dtype), size_);
    p2p(P2pOp{false, buf, count, dtype, peer});
    count_bytes(stats_.recv_bytes, count, dtype);
  }

  // ---- groups, sync, abort ---------------------------------------------------------------------

  std::unique_ptr<Communicator> split(int color, int key) override {
    not_in_group("split");
    MPI_Comm sub = MPI_COMM_NULL;
    const WatchedCall watch("split", 0, size_);
    MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    try {
      return std::make_unique<MpiCommunicator>(sub, true);
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

  void barrier() override {
    const CallTimer timer(&stats_.seconds);
    const WatchedCall watch("barrier", 0, size_);
    not_in_group("barrier");
    MPI_CHECK(MPI_Barrier(comm_));
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code != 0 ? code : 1);  // MPI_Abort does not return; this only satisfies noreturn
  }

 private:
  void not_in_group(const char* what) const {
    BERTH_CHECK(in_flight_.empty(),
                "{} while an asynchronous group is in flight: call wait() first", what);
    BERTH_CHECK(!in_group_,
                "{} inside group_begin/group_end: only send/recv may be grouped on the "
                "MPI communicator; call group_end first",
                what);
  }

  void count_bytes(int64_t& field, size_t count, DType dtype) {
    field += static_cast<int64_t>(count * dtype_size(dtype));
    ++stats_.calls;
  }

  static size_t sum(const std::vector<size_t>& counts) {
    size_t total = 0;
    for (size_t c : counts) total += c;
    return total;
  }
  static size_t p2p_bytes(const std::vector<P2pOp>& ops) {
    size_t total = 0;
    for (const P2pOp& op : ops) total += op.count * dtype_size(op.dtype);
    return total;
  }

  // counts as MPI ints; every count and the total (the last offset) must fit the per-call limit.
  std::vector<int> int_counts(const std::vector<size_t>& counts, const char* what) const {
    BERTH_CHECK(counts.size() == static_cast<size_t>(size_),
                "{}: counts has {} entries, the group has {} ranks", what, counts.size(), size_);
    as_int_count(sum(counts), what);
    std::vector<int> out(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) out[r] = static_cast<int>(counts[r]);
    return out;
  }

  void p2p(const P2pOp& op) {
    BERTH_CHECK(op.peer >= 0 && op.peer < size_, "{} peer {} is not a rank of this group (size {})",
                op.is_send ? "send" : "recv", op.peer, size_);
    mpi_type(op.dtype);  // validate now, not at group_end
    if (in_group_) {
      pending_.push_back(op);
    } else {
      run_p2p({op});
    }
  }

  // Posts every recv, then every send and waits for all of them.
  void run_p2p(const std::vector<P2pOp>& ops) {
    std::vector<MPI_Request> reqs = post_p2p(ops);
    if (reqs.empty()) return;
    MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }

  // Posts every recv, then every send (each chunked to the count limit, chunks in order so they
  // match the peer's chunks by MPI's non-overtaking rule); returns their requests.
  std::vector<MPI_Request> post_p2p(const std::vector<P2pOp>& ops) {
    BERTH_CHECK(in_flight_.empty(), "a group posted while another is in flight: call wait() first");
    std::vector<MPI_Request> reqs;
    if (ops.empty()) return reqs;
    try {
      for (bool sends : {false, true}) {
        for (const P2pOp& op : ops) {
          if (op.is_send != sends) continue;
          const MPI_Datatype mtype = mpi_type(op.dtype);
          const size_t ds = dtype_size(op.dtype);
          size_t done = 0;
          do {
            const size_t n = std::min(detail::g_max_count, op.count - done);
            void* b = or_dummy(op.buf ? static_cast<char*>(op.buf) + done * ds : nullptr);
            MPI_Request req = MPI_REQUEST_NULL;
            if (sends) {
              MPI_CHECK(MPI_Isend(b, static_cast<int>(n), mtype, op.peer, kTag, comm_, &req));
            } else {
              MPI_CHECK(MPI_Irecv(b, static_cast<int>(n), mtype, op.peer, kTag, comm_, &req));
            }
            reqs.push_back(req);
            done += n;
          } while (done < op.count);
        }
      }
    } catch (...) {  // do not leave requests posted on buffers the caller may free
      for (MPI_Request& r : reqs) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
      throw;
    }
    return reqs;
  }

  static constexpr int kTag = 0x6265;  // "be"; one tag: order within a peer pair is FIFO

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  bool in_group_ = false;
  std::vector<P2pOp> pending_;
  std::vector<MPI_Request> in_flight_;  // an asynchronous group's requests until wait()
};

void require_mpi(const char* what) {
  int initialized = 0, finalized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  BERTH_CHECK(initialized && !finalized, "{} needs MPI initialized (MPI_Init) and not finalized",
              what);
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_world() {
  require_mpi("make_mpi_world");
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

LocalRank mpi_local_rank() {
  require_mpi("mpi_local_rank");
  MPI_Comm local = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  LocalRank out;
  const int rc_rank = MPI_Comm_rank(local, &out.rank);
  const int rc_size = MPI_Comm_size(local, &out.size);
  MPI_CHECK(MPI_Comm_free(&local));
  MPI_CHECK(rc_rank);
  MPI_CHECK(rc_size);
  return out;
}

}  // namespace berth
