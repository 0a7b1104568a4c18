// A test backend that runs the CUDA backend's op wiring (kernels/cuda/item_backend.h) and kernel
// bodies (thread_bodies.h, row_bodies.h, flash_bodies.h) on the host: one loop per kernel launch
// (a block kernel's blocks in turn, each played by one thread or in SIMT mode by a host thread per
// GPU thread), host memory, the CPU reference's GEMMs. Whatever the CUDA backend computes per work
// item or block, this computes too, on any machine.
//
// Guarded (make_host_items_backend(true)): its memory is unreadable between its calls (pages
// mapped PROT_NONE, opened only while one of its ops or memory calls runs), so host code that
// touches "device" memory other than through upload/download crashes the test at that line, as
// it would fault on a GPU.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/item_backend.h"
#include "runtime/comm/communicator.h"
#include "runtime/core/check.h"

namespace berth::test {

// Host executor for item_backend.h: host memory (the CPU backend's), one loop per launch, GEMMs
// from the CPU reference (the CUDA backend's are cuBLAS, checked by test_backend_gpu).
class HostExec : public Backend {
 public:
  // device_capacity > 0 makes it report a device of that many bytes (free = capacity − what it
  // holds), as the CUDA backend reports its GPU's; 0: host memory, like the CPU backend.
  // max_shared: the shared memory a tiled kernel's block may have (its host size, where a bf16 is
  // a 4-byte float), as a GPU's limit; the default takes every kernel. simt: run a tiled kernel's
  // block on as many host threads as it has GPU threads (kernels/cuda/host_simt.h) instead of
  // one.
  explicit HostExec(bool guarded = false, int64_t device_capacity = 0, size_t max_shared = SIZE_MAX,
                    bool simt = false)
      : guarded_(guarded), capacity_(device_capacity), max_shared_(max_shared), simt_(simt) {}
  ~HostExec() override {
    for (auto& [p, n] : maps_) munmap(p, n);
  }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return guarded_ ? "host-items (guarded)" : "host-items"; }
  void* alloc(size_t bytes) override {
    if (!guarded_) return mem_->alloc(bytes);
    if (bytes == 0) return nullptr;
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), n = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    BERTH_CHECK(p != MAP_FAILED, "guarded host-items: mmap of {} bytes failed", n);
    maps_[p] = n;
    in_use_ += int64_t(bytes), peak_ = std::max(peak_, in_use_), sizes_[p] = bytes;
    return p;
  }
  void release(void* p) override {
    if (!guarded_) return mem_->release(p);
    if (p == nullptr) return;
    auto it = maps_.find(p);
    BERTH_CHECK(it != maps_.end(), "guarded host-items: release of a pointer it did not allocate");
    munmap(p, it->second);
    in_use_ -= int64_t(sizes_[p]);
    maps_.erase(it), sizes_.erase(p);
  }
  void zero(void* p, size_t bytes) override {
    const Open o(this);
    mem_->zero(p, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    const Open o(this);
    mem_->copy(dst, src, bytes);
  }
  void copy_2d(void* dst, size_t dp, const void* src, size_t sp, size_t w, size_t rows) override {
    const Open o(this);
    mem_->copy_2d(dst, dp, src, sp, w, rows);
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    const Open o(this);
    mem_->upload(dst, host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    const Open o(this);
    mem_->download(host, src, bytes);
  }
  void synchronize() override {}
  int64_t bytes_in_use() const override { return guarded_ ? in_use_ : mem_->bytes_in_use(); }
  int64_t peak_bytes() const override { return guarded_ ? peak_ : mem_->peak_bytes(); }
  DeviceMemory device_memory() const override {
    if (capacity_ <= 0) return {};
    return {capacity_, capacity_ - bytes_in_use()};
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    const Open o(this);
    mem_->set_matmul_precision(this->matmul_precision());
    mem_->matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    const Open o(this);
    mem_->set_matmul_precision(this->matmul_precision());
    mem_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  template <typename F>
  void launch(const char*, int64_t n, F f) {
    const Open o(this);
    for (int64_t i = 0; i < n; ++i) f(i);
  }
  // A tiled kernel's blocks one after another, each played by one host thread (kernels/cuda/
  // tiles.h), or in SIMT mode by `threads` host threads, its shared memory filled with 0xff bytes
  // (NaN as floats) first, so a read of shared memory the block has not written shows in the
  // results.
  template <class K>
  void launch_tiles(const char*, int64_t blocks, int threads, size_t shared, const K& k) {
    const Open o(this);
    constexpr size_t kAlign = cuda::tiles::kSharedAlign;
    std::vector<unsigned char> buf(shared + kAlign);
    unsigned char* smem = buf.data() + (kAlign - reinterpret_cast<uintptr_t>(buf.data()) % kAlign);
    if (simt_) return launch_simt(blocks, threads, smem, shared, k);
    for (int64_t b = 0; b < blocks; ++b) {
      std::memset(smem, 0xff, shared);
      k.run(int(b), cuda::tiles::Team{0, 1}, smem);
    }
  }
  size_t max_block_shared_bytes() const { return max_shared_; }

 private:
  // The blocks one after another, each run by `threads` host threads at once; between blocks the
  // threads meet at a barrier and thread 0 refills the shared memory. The first error of any
  // thread is rethrown here once all have stopped.
  template <class K>
  void launch_simt(int64_t blocks, int threads, unsigned char* smem, size_t shared, const K& k) {
    namespace simt = cuda::tiles::host_simt;
    BERTH_CHECK(threads > 0 && threads % cuda::tiles::kWarpSize == 0,
                "host SIMT executor: {} threads a block is not a whole number of warps", threads);
    simt::BlockSync sync(threads);
    std::mutex m;
    std::exception_ptr first;
    auto fail = [&](std::exception_ptr e) {
      {
        const std::lock_guard<std::mutex> lk(m);
        if (!first) first = e;
      }
      sync.abandon();
    };
    std::vector<std::thread> workers;
    try {
      for (int t = 0; t < threads; t++) {
        workers.emplace_back([&, t] {
          simt::current = &sync, simt::tid = t;
          try {
            for (int64_t b = 0; b < blocks; ++b) {
              if (t == 0) std::memset(smem, 0xff, shared);
              sync.sync_block(t);
              k.run(int(b), cuda::tiles::Team{t, threads}, smem);
              sync.sync_block(t);
            }
          } catch (const simt::Abandoned&) {  // another thread failed first
          } catch (...) {
            fail(std::current_exception());
          }
          simt::current = nullptr;
        });
      }
    } catch (...) {  // a thread that could not start: release the others, which wait for it
      fail(std::current_exception());
    }
    for (std::thread& w : workers) w.join();
    if (first) std::rethrow_exception(first);
  }

 public:
  // Makes every allocation readable and writable for its scope (guarded mode): the backend's own
  // calls, and a communicator's on its memory (GuardedComm), as NCCL reads device memory.
  struct Open {
    explicit Open(HostExec* e) : e(e) { e->protect(PROT_READ | PROT_WRITE); }
    ~Open() { e->protect(PROT_NONE); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
    HostExec* e;
  };

 private:
  void protect(int prot) {
    if (!guarded_) return;
    for (auto& [p, n] : maps_) mprotect(p, n, prot);
  }

  bool guarded_;
  int64_t capacity_;
  size_t max_shared_;
  bool simt_;
  std::unique_ptr<Backend> mem_ = make_cpu_backend();
  std::map<void*, size_t> maps_, sizes_;
  int64_t in_use_ = 0, peak_ = 0;
};

inline std::unique_ptr<Backend> make_host_items_backend(bool guarded = false,
                                                        int64_t device_capacity = 0,
                                                        size_t max_shared = SIZE_MAX,
                                                        bool simt = false) {
  return std::make_unique<cuda::ItemBackend<HostExec>>(guarded, device_capacity, max_shared, simt);
}

// A communicator over another (MPI, host memory) whose calls may read and write a guarded
// host-items backend's memory, as NCCL reads and writes device memory: each call opens the
// guard. Between calls the memory is closed again; MPI moves a posted message only inside its
// calls when Open MPI's single-copy shared-memory path (a peer reading this rank's pages) is off,
// which the MPI tests set (OMPI_MCA_btl_vader_single_copy_mechanism=none). split() wraps the new group too.
class GuardedComm final : public Communicator {
 public:
  GuardedComm(Communicator& inner, Backend& guarded)
      : inner_(&inner), exec_(dynamic_cast<HostExec*>(&guarded)) {
    BERTH_CHECK(exec_ != nullptr, "GuardedComm needs a host-items backend");
  }
  GuardedComm(std::unique_ptr<Communicator> owned, Backend& guarded)
      : GuardedComm(*owned, guarded) {
    owned_ = std::move(owned);
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce(const void* s, void* r, size_t n, DType t, ReduceOp op) override {
    call([&] { inner_->all_reduce(s, r, n, t, op); });
  }
  void reduce_scatter(const void* s, void* r, const std::vector<size_t>& c, DType t,
                      ReduceOp op) override {
    call([&] { inner_->reduce_scatter(s, r, c, t, op); });
  }
  void all_gather(const void* s, void* r, const std::vector<size_t>& c, DType t) override {
    call([&] { inner_->all_gather(s, r, c, t); });
  }
  void broadcast(void* b, size_t n, DType t, int root) override {
    call([&] { inner_->broadcast(b, n, t, root); });
  }
  void group_begin() override { call([&] { inner_->group_begin(); }); }
  void group_end() override { call([&] { inner_->group_end(); }); }
  void group_end_async() override { call([&] { inner_->group_end_async(); }); }
  void wait() override { call([&] { inner_->wait(); }); }
  void send(const void* b, size_t n, DType t, int peer) override {
    call([&] { inner_->send(b, n, t, peer); });
  }
  void recv(void* b, size_t n, DType t, int peer) override {
    call([&] { inner_->recv(b, n, t, peer); });
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> sub = inner_->split(color, key);
    if (!sub) return nullptr;
    return std::make_unique<GuardedComm>(std::move(sub), *dynamic_cast<Backend*>(exec_));
  }
  void barrier() override { call([&] { inner_->barrier(); }); }
  [[noreturn]] void abort(int code) override {
    inner_->abort(code);
    std::abort();  // not reached: the inner abort does not return
  }

 private:
  template <typename F>
  void call(F f) {
    const HostExec::Open open(exec_);
    f();
    stats_ = inner_->stats();
  }
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  HostExec* exec_;
};

}  // namespace berth::test
