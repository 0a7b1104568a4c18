// Backend: memory and the op table of kernels/ops.h on one device (fp32).
//
// Every pointer an op or a memory call takes lives on the backend's device (host memory for the
// CPU backend, device memory for CUDA), except where a call says `host`. Ops are stream-ordered:
// on CUDA they are queued on the backend's stream and `synchronize()` waits for them; on the CPU
// they have finished when they return. The op semantics, shapes and accumulate/overwrite rules are
// those of kernels/ops.h, which the CPU backend calls directly; a CUDA op is tested against it.
// The factory (kernels/backend.h) chooses the device; no CUDA type appears here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace berth {

enum class DeviceKind { kCpu, kCuda };

// What a GEMM (matmul_forward / matmul_backward) computes in:
//   kFp32: fp32 inputs and products (on CUDA no TF32: the mode that compares with the CPU);
//   kBf16: the inputs (activations, weights, output gradients) rounded to bfloat16, products
//          accumulated in fp32, outputs and bias in fp32: bf16 tensor cores on CUDA, the same
//          rounding emulated on the CPU (kernels/ops.h round_to_bf16). The parameters the
//          optimizer updates stay fp32 (master weights), as do moments, gradients and the loss.
enum class MatmulPrecision { kFp32, kBf16 };
const char* matmul_precision_name(MatmulPrecision p);
MatmulPrecision parse_matmul_precision(const std::string& name);  // "fp32" | "bf16"; throws

// The CUDA backend's tiled tensor-core attention (kernels/cuda/flash_bodies.h) by head size: the
// least shared memory a block needs on the device, in bytes (its backward with 32-query tiles,
// its largest kernel then; the forward and the 64-query backward need less and more), or 0 where
// the kernels are not built for the head size. The one list: the backend dispatches on it, and
// `berth plan` counts attention at the bf16 rate where a profile's GPU has this much.
// test_backend_gpu checks the figures against the kernels' own layout.
constexpr size_t tiled_attention_shared_bytes(int hs) {
  switch (hs) {
    case 32:
      return 67584;  // 66 KiB
    case 64:
      return 96256;  // 94 KiB
    case 80:
      return 110592;  // 108 KiB
    case 96:
      return 124928;  // 122 KiB
    case 128:
      return 153600;  // 150 KiB
    default:
      return 0;
  }
}
constexpr bool tiled_attention_head_size(int hs) { return tiled_attention_shared_bytes(hs) > 0; }

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 NVIDIA H200"

  // ---- memory ---------------------------------------------------------------------------------
  // Bytes on the device (never null for bytes > 0; throws berth::Error when out of memory). The
  // CUDA backend serves these from a caching pool, so a steady step allocates nothing new.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(float* p, int64_t n, float value) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;     // device → device
  // `rows` rows of `width` bytes, from rows `src_pitch` bytes apart to rows `dst_pitch` apart
  // (device → device; e.g. q, k, v out of a fused qkv).
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                       size_t width, size_t rows) = 0;
  // host → device; the host buffer may be reused as soon as the call returns (the copy itself
  // may still be in flight on the stream)
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* src, size_t bytes) = 0;  // device → host (waits)
  virtual void synchronize() = 0;
  // Bytes this backend holds now and at most so far (its pool on CUDA, its allocations on CPU).
  // On CUDA a release is stream-ordered: bytes_in_use() may count it until synchronize().
  virtual int64_t bytes_in_use() const = 0;
  virtual int64_t peak_bytes() const = 0;
  // The device's memory: total and free now (cudaMemGetInfo on CUDA, whoever holds the rest).
  // A backend on host memory has no device: total = free = 0, and host figures (RSS, MemTotal)
  // describe it instead.
  struct DeviceMemory {
    int64_t total = 0, free = 0;
  };
  virtual DeviceMemory device_memory() const { return {}; }
  // The stream the ops are queued on, as an opaque handle (a cudaStream_t on CUDA), so a
  // communicator on device buffers can order its own stream against it; null on the CPU.
  virtual void* stream_handle() const { return nullptr; }

  // The precision of the GEMMs that follow (default kFp32).
  void set_matmul_precision(MatmulPrecision p) { matmul_precision_ = p; }
  MatmulPrecision matmul_precision() const { return matmul_precision_; }

  // ---- ops (kernels/ops.h) ----------------------------------------------------------------------
  virtual void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions,
                               const float* wte, const float* wpe, int N, int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const int32_t* tokens, const int32_t* positions, int N,
                                int C) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void matmul_forward(float* out, const float* inp, const float* weight,
                              const float* bias, int N, int IC, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int IC, int OC) = 0;
  // The MLP's first linear layer: pre (N, OC) = inp·Wᵀ + bias and out = gelu(pre), which is what
  // this default does (matmul_forward, then gelu_forward); a backend may fuse the two (CUDA:
  // cuBLASLt's GELU_AUX_BIAS epilogue).
  virtual void matmul_gelu_forward(float* out, float* pre, const float* inp, const float* weight,
                                   const float* bias, int N, int IC, int OC);
  // The backward of the MLP's second linear layer, whose input is inp = gelu(pre) (N, IC):
  // dweight += doutᵀ·inp, dbias += Σ_n dout and dpre (N, IC) = (dout·W) ⊙ gelu'(pre),
  // overwritten (each when not null): what this default does (matmul_backward into dpre, then
  // gelu_backward in place); a backend may fuse the GELU's derivative into the dinp GEMM (CUDA:
  // cuBLASLt's DGELU epilogue).
  virtual void gelu_matmul_backward(float* dpre, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* pre, int N,
                                    int IC, int OC);
  // cu_seqlens (S+1 entries) is read on the host as well: pass a device copy in `cu_seqlens` and
  // the host copy in `cu_seqlens_host` (the same pointer on the CPU).
  virtual void attention_forward(float* out, float* att, const float* qkv,
                                 const int32_t* cu_seqlens, const int32_t* cu_seqlens_host, int S,
                                 int C, int NH) = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                  const float* att, const int32_t* cu_seqlens,
                                  const int32_t* cu_seqlens_host, int S, int C, int NH) = 0;
  virtual void attention_varlen_forward(float* out, float* lse, const float* qkv,
                                        const int32_t* cu_seqlens, const int32_t* cu_seqlens_host,
                                        int S, int C, int NH) = 0;
  virtual void attention_varlen_backward(float* dqkv, const float* dout, const float* out,
                                         const float* lse, const float* qkv,
                                         const int32_t* cu_seqlens,
                                         const int32_t* cu_seqlens_host, int S, int C,
                                         int NH) = 0;
  // Which causal attention the model should run on this backend: the flash-style varlen ops
  // (keep the LSE; GPUs) or attention_forward/backward (keep the probabilities; BLAS on the CPU).
  virtual bool prefers_flash_attention() const = 0;
  // Whether attention_varlen_* and attention_block_* run on tensor cores (bf16 operands) at this
  // head size in the current precision (the CUDA backend in bf16 where its tiled kernels take the
  // head size and fit the device's shared memory); otherwise they are the fp32 kernels.
  virtual bool attention_on_tensor_cores(int head_size) const {
    (void)head_size;
    return false;
  }
  virtual void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                                       const float* v, const int32_t* q_seq, const int32_t* q_pos,
                                       const int32_t* k_seq, const int32_t* k_pos, int nq, int nk,
                                       int C, int NH) = 0;
  virtual void attention_lse_merge(float* out, float* lse, const float* out_b, const float* lse_b,
                                   int nq, int C, int NH) = 0;
  virtual void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                        const float* out, const float* lse, const float* q,
                                        const float* k, const float* v, const int32_t* q_seq,
                                        const int32_t* q_pos, const int32_t* k_seq,
                                        const int32_t* k_pos, int nq, int nk, int C, int NH) = 0;
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                    int N, int V, int Vp) = 0;
  virtual void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                     float dloss, int N, int V, int Vp) = 0;
  virtual void vocab_embedding_forward(float* out, const int32_t* tokens,
                                       const int32_t* positions, const float* wte_local,
                                       const float* wpe, int N, int C, int Vp_local,
                                       int offset) = 0;
  virtual void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout,
                                        const int32_t* tokens, const int32_t* positions, int N,
                                        int C, int Vp_local, int offset) = 0;
  virtual void vocab_ce_max(float* mx, const float* logits_local, int N, int real,
                            int Vp_local) = 0;
  virtual void vocab_ce_partials(float* st, const float* logits_local, const float* mx,
                                 const int32_t* targets, int N, int real, int Vp_local,
                                 int offset) = 0;
  virtual void vocab_ce_finish(float* losses, float* lse, const float* mx, const float* st,
                               const int32_t* targets, int N) = 0;
  virtual void vocab_ce_backward(float* dlogits_local, const float* logits_local,
                                 const float* lse, const int32_t* targets, float dloss, int N,
                                 int real, int Vp_local, int offset) = 0;
  virtual void bias_add(float* out, const float* bias, int N, int OC) = 0;
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float grad_scale, int64_t t) = 0;
  // Σ x² accumulated in double; the result is returned to the host.
  virtual double sum_squares(const float* x, int64_t n) = 0;

 private:
  MatmulPrecision matmul_precision_ = MatmulPrecision::kFp32;
};

// Memory of `n` values of T on a backend, released on destruction. Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, int64_t n)
      : be_(&be), n_(n), p_(n > 0 ? static_cast<T*>(be.alloc(size_t(n) * sizeof(T))) : nullptr) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : be_(o.be_), n_(o.n_), p_(o.p_) {
    o.p_ = nullptr, o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_, n_ = o.n_, p_ = o.p_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return size_t(n_) * sizeof(T); }

 private:
  void reset() {
    if (p_ != nullptr) be_->release(p_);
    p_ = nullptr, n_ = 0;
  }
  Backend* be_ = nullptr;
  int64_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace berth
