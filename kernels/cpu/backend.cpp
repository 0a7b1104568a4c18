// The CPU backend: host memory (malloc) and the reference kernels of kernels/cpu, unchanged.
#include "kernels/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/check.h"

namespace berth {
namespace {

class CpuBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    BERTH_CHECK(p != nullptr, "cpu backend: out of host memory allocating {} bytes", bytes);
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[p] = bytes;
    in_use_ += int64_t(bytes);
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void release(void* p) override {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(p);
      BERTH_CHECK(it != sizes_.end(), "cpu backend: release of a pointer it did not allocate");
      in_use_ -= int64_t(it->second);
      sizes_.erase(it);
    }
    std::free(p);
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void fill(float* p, int64_t n, float value) override { std::fill(p, p + n, value); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
    }
  }
  void upload(void* dst, const void* host, size_t bytes) override { copy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) override { copy(host, src, bytes); }
  void synchronize() override {}
  int64_t bytes_in_use() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  int64_t peak_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

  void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C) override {
    cpu::encoder_forward(out, tokens, positions, wte, wpe, N, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, positions, N, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  // In bf16 precision the GEMM inputs are rounded into scratch first (kernels/ops.h: a bf16 GEMM
  // is the fp32 GEMM of rounded inputs); the scratch grows to the largest GEMM once.
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    if (matmul_precision() == MatmulPrecision::kBf16) {
      inp = rounded(0, inp, int64_t(N) * IC);
      weight = rounded(1, weight, int64_t(OC) * IC);
    }
    cpu::matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    if (matmul_precision() == MatmulPrecision::kBf16) {
      inp = dweight != nullptr ? rounded(0, inp, int64_t(N) * IC) : inp;
      weight = dinp != nullptr ? rounded(1, weight, int64_t(OC) * IC) : weight;
      // dbias sums the fp32 output gradient; only the GEMMs see it rounded
      float* d = rounded(2, dout, int64_t(N) * OC);
      cpu::matmul_backward<float>(dinp, dweight, nullptr, d, inp, weight, N, IC, OC);
      if (dbias != nullptr)
        cpu::matmul_backward<float>(nullptr, nullptr, dbias, dout, nullptr, nullptr, N, IC, OC);
      return;
    }
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens,
                         const int32_t*, int S, int C, int NH) override {
    cpu::attention_forward(out, att, qkv, cu_seqlens, S, C, NH);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, const int32_t* cu_seqlens, const int32_t*, int S,
                          int C, int NH) override {
    cpu::attention_backward(dqkv, datt, dout, qkv, att, cu_seqlens, S, C, NH);
  }
  void attention_varlen_forward(float* out, float* lse, const float* qkv, const int32_t* cu,
                                const int32_t*, int S, int C, int NH) override {
    cpu::attention_varlen_forward(out, lse, qkv, cu, S, C, NH);
  }
  void attention_varlen_backward(float* dqkv, const float* dout, const float* out,
                                 const float* lse, const float* qkv, const int32_t* cu,
                                 const int32_t*, int S, int C, int NH) override {
    cpu::attention_varlen_backward(dqkv, dout, out, lse, qkv, cu, S, C, NH);
  }
  bool prefers_flash_attention() const override { return false; }
  void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const int32_t* q_seq, const int32_t* q_pos,
                               const int32_t* k_seq, const int32_t* k_pos, int nq, int nk, int C,
                               int NH) override {
    cpu::attention_block_forward(out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C, NH);
  }
  void attention_lse_merge(float* out, float* lse, const float* out_b, const float* lse_b, int nq,
                           int C, int NH) override {
    cpu::attention_lse_merge(out, lse, out_b, lse_b, nq, C, NH);
  }
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, const int32_t* q_seq,
                                const int32_t* q_pos, const int32_t* k_seq, const int32_t* k_pos,
                                int nq, int nk, int C, int NH) override {
    cpu::attention_block_backward(dq, dk, dv, dout, out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos,
                                  nq, nk, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) override {
    cpu::residual_forward(out, a, b, n);
  }
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                            int V, int Vp) override {
    cpu::crossentropy_forward(losses, logits, targets, N, V, Vp);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int N, int V, int Vp) override {
    cpu::crossentropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                               const float* wte_local, const float* wpe, int N, int C,
                               int Vp_local, int offset) override {
    cpu::vocab_embedding_forward(out, tokens, positions, wte_local, wpe, N, C, Vp_local, offset);
  }
  void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout,
                                const int32_t* tokens, const int32_t* positions, int N, int C,
                                int Vp_local, int offset) override {
    cpu::vocab_embedding_backward(dwte_local, dwpe, dout, tokens, positions, N, C, Vp_local,
                                  offset);
  }
  void vocab_ce_max(float* mx, const float* logits_local, int N, int real, int Vp_local) override {
    cpu::vocab_ce_max(mx, logits_local, N, real, Vp_local);
  }
  void vocab_ce_partials(float* st, const float* logits_local, const float* mx,
                         const int32_t* targets, int N, int real, int Vp_local,
                         int offset) override {
    cpu::vocab_ce_partials(st, logits_local, mx, targets, N, real, Vp_local, offset);
  }
  void vocab_ce_finish(float* losses, float* lse, const float* mx, const float* st,
                       const int32_t* targets, int N) override {
    cpu::vocab_ce_finish(losses, lse, mx, st, targets, N);
  }
  void vocab_ce_backward(float* dlogits_local, const float* logits_local, const float* lse,
                         const int32_t* targets, float dloss, int N, int real, int Vp_local,
                         int offset) override {
    cpu::vocab_ce_backward(dlogits_local, logits_local, lse, targets, dloss, N, real, Vp_local,
                           offset);
  }
  void bias_add(float* out, const float* bias, int N, int OC) override {
    cpu::bias_add(out, bias, N, OC);
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int64_t t) override {
    cpu::adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }

 private:
  // scratch[slot] holds round_to_bf16(x) (slots: 0 activations, 1 weights, 2 output gradients)
  float* rounded(int slot, const float* x, int64_t n) {
    std::vector<float>& s = scratch_[slot];
    if (int64_t(s.size()) < n) s.resize(size_t(n));
    cpu::round_to_bf16(s.data(), x, n);
    return s.data();
  }

  std::vector<float> scratch_[3];
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  int64_t in_use_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

Backend& cpu_backend() {
  static CpuBackend instance;
  return instance;
}

}  // namespace berth
