// A test backend that runs the CUDA backend's op wiring (kernels/cuda/item_backend.h) and thread
// bodies (kernels/cuda/thread_bodies.h) on the host: one loop per kernel launch, host memory, the
// CPU reference's GEMMs. Whatever the CUDA backend computes per work item, this computes too, on
// any machine.
//
// Guarded (make_host_items_backend(true)): its memory is unreadable between its calls (pages
// mapped PROT_NONE, opened only while one of its ops or memory calls runs), so host code that
// touches "device" memory other than through upload/download crashes the test at that line, as
// it would fault on a GPU.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/item_backend.h"
#include "runtime/core/check.h"

namespace berth::test {

// Host executor for item_backend.h: host memory (the CPU backend's), one loop per launch, GEMMs
// from the CPU reference (the CUDA backend's are cuBLAS, checked by test_backend_gpu).
class HostExec : public Backend {
 public:
  explicit HostExec(bool guarded = false) : guarded_(guarded) {}
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
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    const Open o(this);
    mem_->matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    const Open o(this);
    mem_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  template <typename F>
  void launch(const char*, int64_t n, F f) {
    const Open o(this);
    for (int64_t i = 0; i < n; ++i) f(i);
  }

 private:
  // Makes every allocation readable and writable for its scope (guarded mode).
  struct Open {
    explicit Open(HostExec* e) : e(e) { e->protect(PROT_READ | PROT_WRITE); }
    ~Open() { e->protect(PROT_NONE); }
    HostExec* e;
  };
  void protect(int prot) {
    if (!guarded_) return;
    for (auto& [p, n] : maps_) mprotect(p, n, prot);
  }

  bool guarded_;
  std::unique_ptr<Backend> mem_ = make_cpu_backend();
  std::map<void*, size_t> maps_, sizes_;
  int64_t in_use_ = 0, peak_ = 0;
};

inline std::unique_ptr<Backend> make_host_items_backend(bool guarded = false) {
  return std::make_unique<cuda::ItemBackend<HostExec>>(guarded);
}

}  // namespace berth::test
