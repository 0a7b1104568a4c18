// A test backend that runs the CUDA backend's op wiring (kernels/cuda/item_backend.h) and thread
// bodies (kernels/cuda/thread_bodies.h) on the host: one loop per kernel launch, host memory, the
// CPU reference's GEMMs. Whatever the CUDA backend computes per work item, this computes too, on
// any machine.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/item_backend.h"

namespace berth::test {

// Host executor for item_backend.h: host memory (the CPU backend's), one loop per launch, GEMMs
// from the CPU reference (the CUDA backend's are cuBLAS, checked by test_backend_gpu).
class HostExec : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "host-items"; }
  void* alloc(size_t bytes) override { return mem_->alloc(bytes); }
  void release(void* p) override { mem_->release(p); }
  void zero(void* p, size_t bytes) override { mem_->zero(p, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { mem_->copy(dst, src, bytes); }
  void copy_2d(void* dst, size_t dp, const void* src, size_t sp, size_t w, size_t rows) override {
    mem_->copy_2d(dst, dp, src, sp, w, rows);
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    mem_->upload(dst, host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    mem_->download(host, src, bytes);
  }
  void synchronize() override {}
  int64_t bytes_in_use() const override { return mem_->bytes_in_use(); }
  int64_t peak_bytes() const override { return mem_->peak_bytes(); }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    mem_->matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    mem_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  template <typename F>
  void launch(const char*, int64_t n, F f) {
    for (int64_t i = 0; i < n; ++i) f(i);
  }

 private:
  std::unique_ptr<Backend> mem_ = make_cpu_backend();
};


inline std::unique_ptr<Backend> make_host_items_backend() {
  return std::make_unique<cuda::ItemBackend<HostExec>>();
}

}  // namespace berth::test
