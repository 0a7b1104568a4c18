// NcclCommunicator: the Communicator on device buffers (see nccl.h and communicator.h).
//
// Ordering: before each call the communicator's stream waits for an event recorded on the
// backend's (compute) stream, so whatever the caller queued before is in the buffers; after it the
// compute stream waits for an event recorded on the communicator's stream, so whatever the caller
// queues next sees the result. Nothing blocks the host except host-buffer calls (staged through
// device scratch memory, then waited for) and barrier(). group_end_async() records the event
// without making the compute stream wait; wait() adds that wait. `CommStats::seconds` is host time
// inside the calls (launch and staging), not the device time of the transfers, which overlaps.
//
// Uneven reduce_scatter / all_gather (ZeRO shards) are one grouped ncclReduce / ncclBroadcast per
// rank block; even ones are ncclReduceScatter / ncclAllGather.
#include "runtime/comm/nccl.h"

#include "runtime/core/check.h"

namespace berth {
bool nccl_built() { return BERTH_NCCL != 0; }
}  // namespace berth

#if !BERTH_NCCL
namespace berth {
std::unique_ptr<Communicator> make_nccl(Backend&, const NcclBootstrap&) {
  BERTH_FAIL(
      "this berth has no NCCL communicator (built without CUDA, or NCCL was not found: install "
      "it with the CUDA toolkit, or point NCCL_ROOT at it, and rebuild)");
}
}  // namespace berth
#else

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/comm/call_timer.h"
#include "runtime/comm/watchdog.h"

#define NCCL_CHECK(expr)                                                                       \
  do {                                                                                         \
    const ncclResult_t berth_nccl_r_ = (expr);                                                 \
    if (berth_nccl_r_ != ncclSuccess) {                                                        \
      throw ::berth::Error(::fmt::format(                                                      \
          "NCCL error in `{}` at {}:{} on {}: {} {}", #expr, __FILE__, __LINE__,               \
          ::berth::identity(), ncclGetErrorString(berth_nccl_r_), ncclGetLastError(nullptr))); \
    }                                                                                          \
  } while (0)

#define CUDA_RT_CHECK(expr)                                                                  \
  do {                                                                                       \
    const cudaError_t berth_cuda_e_ = (expr);                                                \
    if (berth_cuda_e_ != cudaSuccess) {                                                      \
      throw ::berth::Error(::fmt::format("CUDA error {} in `{}` at {}:{} on {}",             \
                                         cudaGetErrorString(berth_cuda_e_), #expr, __FILE__, \
                                         __LINE__, ::berth::identity()));                    \
    }                                                                                        \
  } while (0)

namespace berth {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  BERTH_FAIL("unknown DType value {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::SUM:
      return ncclSum;
    case ReduceOp::MAX:
      return ncclMax;
    case ReduceOp::AVG:
      BERTH_CHECK(t == DType::F32 || t == DType::F64,
                  "ReduceOp::AVG needs a floating-point dtype; reduce with SUM and divide");
      return ncclAvg;
  }
  BERTH_FAIL("unknown ReduceOp value {}", static_cast<int>(op));
}

bool on_device(const void* p) {
  if (p == nullptr) return true;  // nothing to stage
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a plain host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The events that mark NCCL calls for the watchdog, reused: a call takes one and its probe gives
// it back when the watchdog drops the call (on the watchdog's thread, hence the lock), so a
// collective costs a cudaEventRecord, not an event's creation and destruction. Shared by the
// communicator and the probes still open, so it outlives whichever goes last.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    cudaSetDevice(device_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        const cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CUDA_RT_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }
  int device() const { return device_; }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t compute, int device, void (*abort_world)(int code))
      : comm_(comm), compute_(compute), device_(device), abort_world_(abort_world) {
    probe_comm_->comm = comm_;
    NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    NCCL_CHECK(ncclCommCount(comm_, &size_));
    CUDA_RT_CHECK(cudaSetDevice(device_));
    CUDA_RT_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Staged host values (a loss, a norm: every step) come from the device's default pool: keep
    // its freed blocks cached, so a steady step asks the driver for nothing (its release
    // threshold is 0 by default: everything back at each synchronization).
    cudaMemPool_t pool = nullptr;
    CUDA_RT_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t keep = UINT64_MAX;
    CUDA_RT_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CUDA_RT_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
    CUDA_RT_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(probe_comm_->mu);
      probe_comm_->comm = nullptr;  // the watchdog's probes no longer query it
    }
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);  // an error unwinds: peers may never come, do not wait for them
    } else {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    const CallTimer timer(&stats_.seconds);
    not_in_group("all_reduce");
    const size_t bytes = count * dtype_size(dtype);
    Staged st(this, send, bytes, recv, bytes);
    NCCL_CHECK(ncclAllReduce(st.send(), st.recv(), count, nccl_type(dtype), nccl_op(op, dtype),
                             comm_, stream_));
    st.finish("all_reduce", bytes);
    count_bytes(stats_.all_reduce_bytes, count, dtype);
  }

  void reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                      ReduceOp op) override {
    const CallTimer timer(&stats_.seconds);
    not_in_group("reduce_scatter");
    check_counts(counts, "reduce_scatter");
    const size_t ds = dtype_size(dtype), total = sum(counts);
    Staged st(this, send, total * ds, recv, counts[size_t(rank_)] * ds);
    if (all_equal(counts)) {
      NCCL_CHECK(ncclReduceScatter(st.send(), st.recv(), counts[0], nccl_type(dtype),
                                   nccl_op(op, dtype), comm_, stream_));
    } else {
      NCCL_CHECK(ncclGroupStart());
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        NCCL_CHECK(ncclReduce(static_cast<const char*>(st.send()) + off * ds, st.recv(),
                              counts[size_t(r)], nccl_type(dtype), nccl_op(op, dtype), r, comm_,
                              stream_));
        off += counts[size_t(r)];
      }
      NCCL_CHECK(ncclGroupEnd());
    }
    st.finish("reduce_scatter", total * ds);
    count_bytes(stats_.reduce_scatter_bytes, total, dtype);
  }

  void all_gather(const void* send, void* recv, const std::vector<size_t>& counts,
                  DType dtype) override {
    const CallTimer timer(&stats_.seconds);
    not_in_group("all_gather");
    check_counts(counts, "all_gather");
    const size_t ds = dtype_size(dtype), total = sum(counts);
    Staged st(this, send, counts[size_t(rank_)] * ds, recv, total * ds);
    if (all_equal(counts)) {
      NCCL_CHECK(ncclAllGather(st.send(), st.recv(), counts[0], nccl_type(dtype), comm_, stream_));
    } else {
      NCCL_CHECK(ncclGroupStart());
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        NCCL_CHECK(ncclBroadcast(st.send(), static_cast<char*>(st.recv()) + off * ds,
                                 counts[size_t(r)], nccl_type(dtype), r, comm_, stream_));
        off += counts[size_t(r)];
      }
      NCCL_CHECK(ncclGroupEnd());
    }
    st.finish("all_gather", total * ds);
    count_bytes(stats_.all_gather_bytes, total, dtype);
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    const CallTimer timer(&stats_.seconds);
    not_in_group("broadcast");
    const size_t bytes = count * dtype_size(dtype);
    Staged st(this, buf, bytes, buf, bytes);
    NCCL_CHECK(ncclBroadcast(st.send(), st.recv(), count, nccl_type(dtype), root, comm_, stream_));
    st.finish("broadcast", bytes);
    count_bytes(stats_.broadcast_bytes, count, dtype);
  }

  // ---- point-to-point: device buffers only
  // -------------------------------------------------------

  void group_begin() override {
    BERTH_CHECK(!in_flight_, "group_begin while an asynchronous group is in flight: call wait()");
    BERTH_CHECK(!in_group_, "group_begin inside an open group (groups do not nest)");
    in_group_ = true;
    order_after_compute();
    NCCL_CHECK(ncclGroupStart());
  }
  void group_end() override {
    group_end_async();
    wait();
  }
  void group_end_async() override {
    const CallTimer timer(&stats_.seconds);
    BERTH_CHECK(in_group_, "group_end without a matching group_begin");
    in_group_ = false;
    NCCL_CHECK(ncclGroupEnd());
    CUDA_RT_CHECK(cudaEventRecord(after_, stream_));
    watch("send/recv group", group_bytes_);
    group_bytes_ = 0;
    in_flight_ = true;
  }
  void wait() override {
    if (!in_flight_) return;
    in_flight_ = false;
    CUDA_RT_CHECK(cudaStreamWaitEvent(compute_, after_, 0));  // stream-ordered, the host goes on
    check_async();
  }
  void send(const void* buf, size_t count, DType dtype, int peer) override {
    p2p_check(buf, count, peer, "send");
    NCCL_CHECK(ncclSend(buf, count, nccl_type(dtype), peer, comm_, stream_));
    group_bytes_ += count * dtype_size(dtype);
    count_bytes(stats_.send_bytes, count, dtype);
  }
  void recv(void* buf, size_t count, DType dtype, int peer) override {
    p2p_check(buf, count, peer, "recv");
    NCCL_CHECK(ncclRecv(buf, count, nccl_type(dtype), peer, comm_, stream_));
    group_bytes_ += count * dtype_size(dtype);
    count_bytes(stats_.recv_bytes, count, dtype);
  }

  // ---- groups, sync, abort ---------------------------------------------------------------------

  std::unique_ptr<Communicator> split(int color, int key) override {
    not_in_group("split");
    ncclComm_t sub = nullptr;
    const WatchedCall watch("split", 0, size_);
    NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    if (color < 0 || sub == nullptr) return nullptr;
    return std::make_unique<NcclCommunicator>(sub, compute_, device_, abort_world_);
  }

  void barrier() override {
    int32_t one = 1;
    all_reduce(&one, &one, 1, DType::I32, ReduceOp::SUM);  // host buffer: staged and waited for
  }

  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    if (abort_world_ != nullptr) abort_world_(code);
    std::_Exit(code != 0 ? code : 1);
  }

 private:
  // A collective's buffers on the device: host ones are copied to scratch memory (the input
  // before, the output back after, then waited for), device ones are used as they are.
  class Staged {
   public:
    Staged(NcclCommunicator* c, const void* send, size_t send_bytes, void* recv, size_t recv_bytes)
        : c_(c), send_(send), recv_(recv), recv_bytes_(recv_bytes) {
      c_->order_after_compute();
      const bool host = !on_device(send) || !on_device(recv);
      if (!host) return;
      const bool in_place = send == recv;
      CUDA_RT_CHECK(cudaMallocAsync(&d_recv_, std::max<size_t>(recv_bytes, 1), c_->stream_));
      d_send_ = d_recv_;
      if (!in_place) {
        CUDA_RT_CHECK(cudaMallocAsync(&d_send_own_, std::max<size_t>(send_bytes, 1), c_->stream_));
        d_send_ = d_send_own_;
      }
      if (send_bytes)
        CUDA_RT_CHECK(cudaMemcpyAsync(d_send_, send, send_bytes, cudaMemcpyDefault, c_->stream_));
      staged_ = true;
    }
    ~Staged() {
      if (d_send_own_) cudaFreeAsync(d_send_own_, c_->stream_);
      if (d_recv_) cudaFreeAsync(d_recv_, c_->stream_);
    }
    const void* send() const { return staged_ ? d_send_ : send_; }
    void* recv() const { return staged_ ? d_recv_ : recv_; }
    // `op` of `bytes` is queued: report it to the watchdog, then copy a staged output back
    void finish(const char* op, size_t bytes) {
      c_->watch(op, bytes);
      if (staged_) {
        if (recv_bytes_)
          CUDA_RT_CHECK(
              cudaMemcpyAsync(recv_, d_recv_, recv_bytes_, cudaMemcpyDefault, c_->stream_));
        CUDA_RT_CHECK(cudaStreamSynchronize(c_->stream_));
      }
      c_->order_compute_after();
      c_->check_async();
    }

   private:
    NcclCommunicator* c_;
    const void* send_;
    void* recv_;
    size_t recv_bytes_;
    void* d_recv_ = nullptr;
    void* d_send_own_ = nullptr;
    void* d_send_ = nullptr;
    bool staged_ = false;
  };

  // Reports the call just queued on stream_ to the process's watchdog (if any): it stays open
  // until an event recorded after it on stream_ has completed.
  void watch(const char* op, size_t bytes) {
    CallWatchdog* w = comm_watchdog();
    if (w == nullptr) return;
    const cudaEvent_t ev = events_->take();
    // The probe runs on the watchdog's thread: it selects this rank's GPU there first, or the
    // runtime would make a context on GPU 0 for every rank. The event goes back to the pool
    // when the watchdog drops the call.
    const std::shared_ptr<CUevent_st> event(
        ev, [pool = events_](cudaEvent_t e) { pool->give_back(e); });
    CUDA_RT_CHECK(cudaEventRecord(ev, stream_));
    // While the call is not done, NCCL's asynchronous error (a peer or the network failed) is
    // polled too, as NCCL's docs ask of a waiting application: the job ends at once, naming it,
    // not after comm_timeout_s.
    w->open(
        op, bytes, size_,
        [event, dev = device_] {
          cudaSetDevice(dev);
          return cudaEventQuery(event.get()) != cudaErrorNotReady;
        },
        [probe = probe_comm_, who = identity()]() -> std::string {
          std::lock_guard<std::mutex> lock(probe->mu);
          ncclResult_t st = ncclSuccess;
          if (probe->comm == nullptr || ncclCommGetAsyncError(probe->comm, &st) != ncclSuccess ||
              st == ncclSuccess || st == ncclInProgress) {
            return "";
          }
          return fmt::format("NCCL asynchronous error on {}: {} {}", who, ncclGetErrorString(st),
                             ncclGetLastError(probe->comm));
        });
  }
  void order_after_compute() {
    CUDA_RT_CHECK(cudaEventRecord(before_, compute_));
    CUDA_RT_CHECK(cudaStreamWaitEvent(stream_, before_, 0));
  }
  void order_compute_after() {
    CUDA_RT_CHECK(cudaEventRecord(after_, stream_));
    CUDA_RT_CHECK(cudaStreamWaitEvent(compute_, after_, 0));
  }
  void check_async() {
    ncclResult_t st = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
    BERTH_CHECK(st == ncclSuccess || st == ncclInProgress, "NCCL asynchronous error on {}: {} {}",
                identity(), ncclGetErrorString(st), ncclGetLastError(comm_));
  }
  void not_in_group(const char* what) const {
    BERTH_CHECK(!in_flight_, "{} while an asynchronous group is in flight: call wait() first",
                what);
    BERTH_CHECK(!in_group_, "{} inside group_begin/group_end: only send/recv may be grouped", what);
  }
  void p2p_check(const void* buf, size_t count, int peer, const char* what) const {
    BERTH_CHECK(in_group_, "NCCL {} outside group_begin/group_end: group every send/recv", what);
    BERTH_CHECK(peer >= 0 && peer < size_, "{} to rank {} of a group of {}", what, peer, size_);
    BERTH_CHECK(count == 0 || on_device(buf),
                "NCCL {} needs a device buffer; this one is host memory", what);
  }
  void check_counts(const std::vector<size_t>& counts, const char* what) const {
    BERTH_CHECK(counts.size() == static_cast<size_t>(size_),
                "{}: counts has {} entries, the group has {} ranks", what, counts.size(), size_);
  }
  static bool all_equal(const std::vector<size_t>& c) {
    for (size_t x : c)
      if (x != c[0]) return false;
    return true;
  }
  static size_t sum(const std::vector<size_t>& counts) {
    size_t total = 0;
    for (size_t c : counts) total += c;
    return total;
  }
  void count_bytes(int64_t& field, size_t count, DType dtype) {
    field += static_cast<int64_t>(count * dtype_size(dtype));
    ++stats_.calls;
  }

  ncclComm_t comm_;
  // comm_ as the watchdog's probes see it, on their thread: null once the communicator goes.
  struct ProbeComm {
    std::mutex mu;
    ncclComm_t comm = nullptr;
  };
  std::shared_ptr<ProbeComm> probe_comm_ = std::make_shared<ProbeComm>();
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  void (*abort_world_)(int code) = nullptr;  // ends every rank of the job (MPI_Abort), or null
  bool in_group_ = false, in_flight_ = false;
  size_t group_bytes_ = 0;  // payload of the send/recv group being built
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>(device_);
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Backend& be, const NcclBootstrap& how) {
  BERTH_CHECK(be.kind() == DeviceKind::kCuda && be.stream_handle() != nullptr,
              "the NCCL communicator needs the CUDA backend (this one is {})", be.name());
  BERTH_CHECK(how.size >= 1 && how.rank >= 0 && how.rank < how.size,
              "NCCL bootstrap: rank {} of {} ranks", how.rank, how.size);
  BERTH_CHECK(how.size == 1 || how.share_id,
              "NCCL bootstrap of {} ranks without a way to share the unique id", how.size);
  int device = 0;
  CUDA_RT_CHECK(cudaGetDevice(&device));
  ncclUniqueId id{};
  const WatchedCall watch("NCCL bootstrap", sizeof id, how.size);
  if (how.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  if (how.size > 1) how.share_id(&id, sizeof id);
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, how.size, id, how.rank));
  return std::make_unique<NcclCommunicator>(comm, static_cast<cudaStream_t>(be.stream_handle()),
                                            device, how.abort_world);
}

}  // namespace berth
#endif  // BERTH_NCCL
