// The CUDA backend: memory from a stream-ordered pool of its own (cudaMallocAsync with the
// release threshold at its maximum, so freed blocks stay cached and a steady step allocates
// nothing from the driver), every op queued on one stream, GEMMs through cuBLAS in fp32 (no TF32:
// the fp32 mode compares with the CPU reference) or, in bf16 precision, on bf16 copies of their
// inputs with fp32 accumulation and output (cublasGemmEx, tensor cores); a forward GEMM with a
// bias through cuBLASLt with the bias (and for the MLP's first layer the GELU) in its epilogue,
// and in bf16 the MLP's GELU derivative in the epilogue of the backward GEMM before it; the other
// ops as item_backend.h wires them: one thread per work item running the bodies of
// thread_bodies.h, a block per row for the row reductions of row_bodies.h, and in bf16 the
// attention as the tiled tensor-core kernels of flash_bodies.h. Every launch is checked, with the
// kernel's name.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/item_backend.h"
#include "runtime/core/log.h"

#define CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                     \
    const cublasStatus_t berth_cublas_st_ = (expr);                                        \
    if (berth_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                       \
      throw ::berth::Error(::fmt::format("cuBLAS error {} in `{}` at {}:{} on {}",         \
                                         int(berth_cublas_st_), #expr, __FILE__, __LINE__, \
                                         ::berth::identity()));                            \
    }                                                                                      \
  } while (0)

namespace berth::cuda {
namespace {

constexpr int kThreads = 256;

template <typename F>
__global__ void for_each_item(int64_t n, F f) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

// Launches f(i) for i in [0, n) on `stream` and checks the launch, naming the kernel.
template <typename F>
void launch_on(const char* name, cudaStream_t stream, int64_t n, F f) {
  if (n <= 0) return;
  const int64_t blocks = CEIL_DIV(n, int64_t(kThreads));
  BERTH_CHECK(blocks <= int64_t(INT32_MAX), "{}: {} work items are too many for one launch", name,
              n);
  for_each_item<<<unsigned(blocks), kThreads, 0, stream>>>(n, f);
  const cudaError_t err = cudaGetLastError();
  BERTH_CHECK(err == cudaSuccess, "CUDA kernel {} failed to launch ({} items): {} ({}) on {}", name,
              n, cudaGetErrorName(err), cudaGetErrorString(err), identity());
}

// A tiled kernel (kernels/cuda/tiles.h): k.run(block, team, shared memory) per block.
template <class K>
__global__ void run_tiles(K k) {
  extern __shared__ __align__(128) unsigned char smem[];
  k.run(int(blockIdx.x), tiles::Team{int(threadIdx.x), int(blockDim.x)}, smem);
}

// runtime/core/backend.h's table of the tiled attention's shared memory (what `berth plan` and
// the head-size dispatch go by) is these kernels' own layout on the device: the backward with
// 32-query tiles, the most that the forward needs too.
template <int HS>
constexpr bool shared_bytes_as_listed() {
  using V = flash::Varlen;  // the regions do not depend on the source
  return flash::Backward<HS, V, 32>::shared_bytes() == tiled_attention_shared_bytes(HS) &&
         flash::Forward<HS, V>::shared_bytes() <= tiled_attention_shared_bytes(HS);
}
static_assert(shared_bytes_as_listed<32>() && shared_bytes_as_listed<64>() &&
                  shared_bytes_as_listed<80>() && shared_bytes_as_listed<96>() &&
                  shared_bytes_as_listed<128>(),
              "tiled_attention_shared_bytes (runtime/core/backend.h) is not the kernels' layout");

// dst (n) = x rounded to bf16, to nearest even
void round_to_bf16_on(cudaStream_t stream, __nv_bfloat16* dst, const float* x, int64_t n) {
  launch_on("round_to_bf16", stream, n,
            [=] __device__(int64_t i) { dst[i] = __float2bfloat16_rn(x[i]); });
}

class CudaExec : public Backend {
 public:
  explicit CudaExec(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    name_ = fmt::format("cuda:{} {}", device, prop.name);
    max_shared_ = prop.sharedMemPerBlockOptin;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // A pool of its own, not the device's default one (which every cudaMallocAsync of the process
    // without a pool shares): its used and high-water figures are this backend's alone.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = UINT64_MAX;  // never give cached blocks back to the driver
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasLtCreate(&lt_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // fp32 GEMMs without TF32 (cublasSgemm under the default math mode; NVIDIA_TF32_OVERRIDE
    // unset): the mode that compares with the CPU reference
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaExec() override {
    // While an error unwinds, queued work may wait on a peer that never comes (an NCCL
    // transfer): do not wait for it, so main can abort the job.
    if (std::uncaught_exceptions() == 0) cudaStreamSynchronize(stream_);
    for (Scratch& sc : bf16_) {
      if (sc.p != nullptr) cudaFreeAsync(sc.p, stream_);
    }
    for (Stage& st : stage_) {  // cudaFreeHost synchronizes: not while an error unwinds
      if (st.host == nullptr || std::uncaught_exceptions() > 0) continue;
      cudaEventDestroy(st.done);
      cudaFreeHost(st.host);
    }
    if (lt_workspace_ != nullptr) cudaFreeAsync(lt_workspace_, stream_);
    // Its memory goes back to the driver once the frees queued above have run and any block
    // still held has been freed: cudaMemPoolDestroy does not wait for them.
    cudaMemPoolDestroy(pool_);
    if (std::uncaught_exceptions() > 0) return;  // cublasDestroy synchronizes the device
    cublasLtDestroy(lt_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, bytes, pool_, stream_);
    BERTH_CHECK(err == cudaSuccess, "{}: cannot allocate {:.1f} MiB on the device: {} on {}", name_,
                double(bytes) / (1 << 20), cudaGetErrorString(err), identity());
    return p;
  }
  // Called from destructors (DeviceBuffer), also while an error unwinds, so it never throws:
  // after a kernel fault every CUDA call returns that sticky error, and the fault is what the
  // failing call already reported. Said once, should the free itself be what fails.
  void release(void* p) override {
    if (p == nullptr) return;
    const cudaError_t err = cudaFreeAsync(p, stream_);
    if (err != cudaSuccess && !release_failed_) {
      release_failed_ = true;
      log_warn("{}: cudaFreeAsync failed: {} (device memory of this process is not reused)", name_,
               cudaGetErrorString(err));
    }
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    if (width && rows)
      CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                   cudaMemcpyDeviceToDevice, stream_));
  }
  // Uploads go through pinned staging the backend owns (kStageSlots slots of kStageBytes, used
  // round-robin; a slot is reused once the copy that read it has completed, an event says when):
  // the source is copied into a slot on the host, the DMA from it is queued on the stream, and
  // the call returns, so the caller may reuse `host` at once, as the interface says, and the
  // transfer overlaps the work queued before it. A source that is itself pinned is copied from
  // directly and waited for (the copy reads it later).
  void upload(void* dst, const void* host, size_t bytes) override {
    if (!bytes) return;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
      cudaGetLastError();  // a plain host pointer on older runtimes
    } else if (a.type == cudaMemoryTypeHost) {
      CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
      synchronize();
      return;
    }
    for (size_t off = 0; off < bytes; off += kStageBytes) {
      const size_t n = std::min(kStageBytes, bytes - off);
      Stage& st = stage_[next_stage_];
      next_stage_ = (next_stage_ + 1) % kStageSlots;
      if (st.host == nullptr) {
        CUDA_CHECK(cudaMallocHost(&st.host, kStageBytes));
        CUDA_CHECK(cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming));
      } else {
        CUDA_CHECK(cudaEventSynchronize(st.done));  // the copy that last read this slot
      }
      std::memcpy(st.host, static_cast<const char*>(host) + off, n);
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, st.host, n, cudaMemcpyHostToDevice,
                                 stream_));
      CUDA_CHECK(cudaEventRecord(st.done, stream_));
    }
  }
  void download(void* host, const void* src, size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  int64_t bytes_in_use() const override { return pool_attr(cudaMemPoolAttrUsedMemCurrent); }
  DeviceMemory device_memory() const override {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return {int64_t(total), int64_t(free)};
  }
  int64_t peak_bytes() const override { return pool_attr(cudaMemPoolAttrUsedMemHigh); }
  void* stream_handle() const override { return stream_; }

  // Row-major (N, IC) · (OC, IC)ᵀ is column-major outᵀ (OC, N) = W (IC, OC)ᵀ · inpᵀ (IC, N).
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    gemm_bias(out, operand(weight, int64_t(OC) * IC, 1), operand(inp, int64_t(N) * IC, 0), bias, N,
              IC, OC);
  }
  // The same with GELU. In bf16: one cuBLASLt GEMM whose epilogue adds the bias, keeps the sum in
  // `pre` and writes gelu of it (GELU_AUX_BIAS). In fp32, the mode that compares with the CPU
  // within 1e-5, the GELU stays berth's kernel (cuBLASLt's GELU is the same tanh form, but how
  // exactly it evaluates tanh is not documented): the bias epilogue, then gelu_forward. Where
  // cuBLASLt does not take the call: the GEMM, bias and gelu kernels.
  void matmul_gelu_forward(float* out, float* pre, const float* inp, const float* weight,
                           const float* bias, int N, int IC, int OC) override {
    const void* w = operand(weight, int64_t(OC) * IC, 1);
    const void* x = operand(inp, int64_t(N) * IC, 0);
    if (bias != nullptr && matmul_precision() == MatmulPrecision::kBf16 &&
        lt_gemm({CUBLAS_OP_T, OC, N, IC, w, x, out, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre}))
      return;
    gemm_bias(pre, w, x, bias, N, IC, OC);
    gelu_forward(out, pre, int64_t(N) * OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    const void* d = operand(dout, int64_t(N) * OC, 2);
    if (dinp != nullptr)  // dinpᵀ (IC, N) = W (IC, OC) · doutᵀ (OC, N)
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, operand(weight, int64_t(OC) * IC, 1), IC, d, OC,
           0.0f, dinp, IC);
    weight_grads(dweight, dbias, d, dout, inp, N, IC, OC);
  }
  // In bf16: the dinp GEMM with cuBLASLt's DGELU epilogue, which multiplies its result by gelu'
  // of the saved pre-activation (the aux input) as it writes it, instead of writing it for
  // gelu_backward to read back. In fp32 (compared with the CPU within
  // 1e-5) and where cuBLASLt does not take the call: matmul_backward, then gelu_backward.
  void gelu_matmul_backward(float* dpre, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, const float* pre, int N, int IC,
                            int OC) override {
    if (matmul_precision() == MatmulPrecision::kFp32 || dpre == nullptr)
      return Backend::gelu_matmul_backward(dpre, dweight, dbias, dout, inp, weight, pre, N, IC, OC);
    const void* d = operand(dout, int64_t(N) * OC, 2);
    const void* w = operand(weight, int64_t(OC) * IC, 1);
    if (!lt_gemm({CUBLAS_OP_N, IC, N, OC, w, d, dpre, CUBLASLT_EPILOGUE_DGELU, nullptr,
                  const_cast<float*>(pre)})) {  // unfused, on the operands already rounded
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, d, OC, 0.0f, dpre, IC);
      gelu_backward(dpre, pre, dpre, int64_t(N) * IC);
    }
    weight_grads(dweight, dbias, d, dout, inp, N, IC, OC);
  }

 public:
  // One CUDA thread per work item on this backend's stream (item_backend.h).
  template <typename F>
  void launch(const char* name, int64_t n, F f) {
    launch_on(name, stream_, n, f);
  }
  // out (N, OC) = x·wᵀ + bias on operands as operand() gave them: the bias in cuBLASLt's
  // epilogue where it takes the GEMM, else a kernel after it. (Public: an extended lambda's
  // enclosing function may not be private.)
  void gemm_bias(float* out, const void* w, const void* x, const float* bias, int N, int IC,
                 int OC) {
    if (bias != nullptr &&
        lt_gemm({CUBLAS_OP_T, OC, N, IC, w, x, out, CUBLASLT_EPILOGUE_BIAS, bias}))
      return;
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, x, IC, 0.0f, out, OC);
    if (bias != nullptr)
      launch_on("add_bias", stream_, int64_t(N) * OC,
                [=] __device__(int64_t i) { body::add_bias(i, out, bias, OC); });
  }
  // dWᵀ (IC, OC) += inpᵀ (IC, N) · dout (N, OC), with dout as operand() gave it (`d`), and the
  // bias gradient from the fp32 output gradient in either precision; either may be null.
  void weight_grads(float* dweight, float* dbias, const void* d, const float* dout,
                    const float* inp, int N, int IC, int OC) {
    if (dweight != nullptr)
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, operand(inp, int64_t(N) * IC, 0), IC, d, OC, 1.0f,
           dweight, IC);
    if (dbias == nullptr) return;
    const int parts = body::column_parts(N);
    DeviceBuffer<float> part(*this, int64_t(parts) * OC);
    float* p = part.data();
    launch_on("bias_grad_partial", stream_, int64_t(parts) * OC,
              [=] __device__(int64_t i) { body::bias_grad_partial(i, p, dout, N, OC); });
    launch_on("bias_grad", stream_, OC,
              [=] __device__(int64_t o) { body::add_column_parts(int(o), dbias, p, parts, OC); });
  }
  // A block per tile, `threads` threads and `shared` bytes of dynamic shared memory each; above
  // the default 48 KiB the kernel is allowed that much first.
  template <class K>
  void launch_tiles(const char* name, int64_t blocks, int threads, size_t shared, const K& k) {
    if (blocks <= 0) return;
    BERTH_CHECK(blocks <= int64_t(INT32_MAX), "{}: {} blocks are too many for one launch", name,
                blocks);
    BERTH_CHECK(shared <= max_shared_, "{}: a block needs {} bytes of shared memory, {} has {}",
                name, shared, name_, max_shared_);
    if (shared > 48 * 1024) {  // once per kernel and size on this backend's device
      size_t& allowed = shared_allowed_[reinterpret_cast<const void*>(run_tiles<K>)];
      if (allowed < shared) {
        CUDA_CHECK(cudaFuncSetAttribute(run_tiles<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(shared)));
        allowed = shared;
      }
    }
    run_tiles<K><<<unsigned(blocks), unsigned(threads), shared, stream_>>>(k);
    const cudaError_t err = cudaGetLastError();
    BERTH_CHECK(err == cudaSuccess,
                "CUDA kernel {} failed to launch ({} blocks of {} threads, {} bytes shared): {} "
                "({}) on {}",
                name, blocks, threads, shared, cudaGetErrorName(err), cudaGetErrorString(err),
                identity());
  }
  size_t max_block_shared_bytes() const { return max_shared_; }

 private:
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  // A pinned upload staging slot and the event recorded after the copy that last read it.
  struct Stage {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  static constexpr int kStageSlots = 8;
  static constexpr size_t kStageBytes = size_t(1) << 20;
  // A GEMM input of n fp32 values as the GEMM reads it: itself in fp32 precision; in bf16, its
  // copy rounded to bf16 (to nearest even, as kernels/ops.h round_to_bf16) in scratch slot `slot`
  // (0 activations, 1 weights, 2 output gradients), which grows (stream-ordered) to the largest
  // such operand once, so a steady step allocates nothing.
  const void* operand(const float* x, int64_t n, int slot) {
    if (matmul_precision() == MatmulPrecision::kFp32) return x;
    Scratch& sc = bf16_[slot];
    const size_t bytes = size_t(n) * sizeof(__nv_bfloat16);
    if (sc.bytes < bytes) {
      void* old = sc.p;
      sc.p = nullptr, sc.bytes = 0;
      release(old);
      sc.p = alloc(bytes);
      sc.bytes = bytes;
    }
    round_to_bf16_on(stream_, static_cast<__nv_bfloat16*>(sc.p), x, n);
    return sc.p;
  }
  // Column-major C (m, n) = op(A) · op(B) + beta·C with fp32 C and accumulation; A and B as
  // operand() gave them (fp32: cublasSgemm; bf16: cublasGemmEx on tensor cores).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, int lda,
            const void* b, int ldb, float beta, float* c, int ldc) {
    const float one = 1.0f;
    if (matmul_precision() == MatmulPrecision::kFp32) {
      CUBLAS_CHECK(cublasSgemm(cublas_, ta, tb, m, n, k, &one, static_cast<const float*>(a), lda,
                               static_cast<const float*>(b), ldb, &beta, c, ldc));
    } else {
      CUBLAS_CHECK(cublasGemmEx(cublas_, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF,
                                ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    }
  }
  // One cuBLASLt GEMM, column-major with fp32 compute (no TF32), alpha 1 and beta 0:
  // D (m, n) fp32 = op(A)·B, A stored k × m (transa T) or m × k (N), B k × n, both in the GEMM
  // precision as operand() gave them, then the epilogue:
  //   BIAS:          D += bias (m);
  //   GELU_AUX_BIAS: aux = that sum, D = gelu(aux) (the tanh form kernels/ops.h uses);
  //   DGELU:         D ⊙= gelu'(aux), aux the saved pre-activation (an input).
  // aux is m × n with leading dimension m.
  struct LtCall {
    cublasOperation_t transa;
    int m, n, k;
    const void* a;
    const void* b;
    float* d;
    cublasLtEpilogue_t epilogue;
    const float* bias = nullptr;
    float* aux = nullptr;
  };
  // False, with nothing queued, where cuBLASLt does not take it: a pointer not 16-byte aligned,
  // aux's leading dimension not a multiple of 8, no algorithm for the shape, or a refused call.
  // The descriptors and the algorithm the heuristic chose are kept per problem (shape, epilogue,
  // precision and the operands' alignment), as cuBLAS advises, since the heuristic costs tens of
  // microseconds of host time a call; only the pointers are set per call.
  //
  // Whether each epilogue ran fused is logged once per outcome (epilogue, precision, fused or
  // not and why), with the first shape: the ops' results are the same either way, so only this
  // says which path a GPU took.
  bool lt_gemm(const LtCall& c) {
    const char* why = nullptr;
    const bool fused = try_lt_gemm(c, &why);
    const bool bf16 = matmul_precision() == MatmulPrecision::kBf16;
    if (lt_reported_.insert({int(c.epilogue), bf16, fused}).second) {
      const char* name = c.epilogue == CUBLASLT_EPILOGUE_BIAS            ? "BIAS"
                         : c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "GELU_AUX_BIAS"
                         : c.epilogue == CUBLASLT_EPILOGUE_DGELU         ? "DGELU"
                                                                         : "other";
      log_info("{}: cuBLASLt {} epilogue in {}: {} (first at m={} n={} k={})", name_, name,
               bf16 ? "bf16" : "fp32",
               fused ? std::string("fused")
                     : fmt::format("not fused ({}); a kernel after the GEMM does it", why),
               c.m, c.n, c.k);
    }
    return fused;
  }
  bool try_lt_gemm(const LtCall& c, const char** why) {
    // the largest power of two up to 256 that divides the address (256 for none)
    auto alignment = [](const void* p) {
      uint32_t align = 256;
      while (reinterpret_cast<uintptr_t>(p) % align != 0) align /= 2;
      return align;
    };
    const bool bf16 = matmul_precision() == MatmulPrecision::kBf16;
    const LtKey key{int(c.transa),
                    c.m,
                    c.n,
                    c.k,
                    int(c.epilogue),
                    bf16,
                    alignment(c.a),
                    alignment(c.b),
                    alignment(c.d),
                    alignment(c.bias),
                    alignment(c.aux)};
    if (std::min({key.align_a, key.align_b, key.align_d, key.align_bias, key.align_aux}) < 16 ||
        (c.aux != nullptr && c.m % 8 != 0)) {
      *why = "an operand not 16-byte aligned, or aux's rows not a multiple of 8";
      return false;
    }
    auto [it, fresh] = lt_plans_.try_emplace(key);
    LtPlan& plan = it->second;
    if (fresh) {
      try {
        plan_lt(plan, c, key, bf16 ? CUDA_R_16BF : CUDA_R_32F);
      } catch (...) {  // no half-made plan stays behind
        lt_plans_.erase(it);
        throw;
      }
    }
    if (!plan.found) {
      *why = "no cuBLASLt algorithm takes it on this GPU";
      return false;
    }
    set_pointers(plan.ds.op, c);
    if (lt_workspace_ == nullptr) lt_workspace_ = alloc(kLtWorkspaceBytes);  // once
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st =
        cublasLtMatmul(lt_, plan.ds.op, &one, c.a, plan.ds.a, c.b, plan.ds.b, &zero, c.d, plan.ds.d,
                       c.d, plan.ds.d, &plan.algo, lt_workspace_, kLtWorkspaceBytes, stream_);
    // a refusal queues nothing: the caller then runs the unfused path, as it will for this
    // problem from now on; any other failure is an error
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
        st == CUBLAS_STATUS_ARCH_MISMATCH) {
      plan.found = false;
      *why = "cublasLtMatmul refused it";
      return false;
    }
    CUBLAS_CHECK(st);
    return true;
  }
  // The bias and aux pointers of call c on its matmul descriptor.
  static void set_pointers(cublasLtMatmulDesc_t op, const LtCall& c) {
    if (c.bias != nullptr)
      lt_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(c.bias));
    if (c.aux != nullptr)
      lt_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(c.aux));
  }
  // What a cuBLASLt plan depends on: the problem, its epilogue and precision, and the alignment
  // of A, B and D the heuristic was told, and of the bias and aux, which it reads from their
  // pointers.
  struct LtKey {
    int transa, m, n, k, epilogue;
    bool bf16;
    uint32_t align_a, align_b, align_d, align_bias, align_aux;
    bool operator<(const LtKey& o) const {
      return std::tie(transa, m, n, k, epilogue, bf16, align_a, align_b, align_d, align_bias,
                      align_aux) < std::tie(o.transa, o.m, o.n, o.k, o.epilogue, o.bf16, o.align_a,
                                            o.align_b, o.align_d, o.align_bias, o.align_aux);
    }
  };
  // The descriptors of one problem, destroyed with it.
  struct LtDescs {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    LtDescs() = default;
    LtDescs(const LtDescs&) = delete;
    LtDescs& operator=(const LtDescs&) = delete;
    ~LtDescs() {
      for (cublasLtMatrixLayout_t l : {a, b, d})
        if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
      if (op != nullptr) cublasLtMatmulDescDestroy(op);
    }
  };
  struct LtPlan {
    LtDescs ds;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // an algorithm takes the problem (and cuBLASLt has not refused it)
  };
  // Creates the descriptors of c's problem and asks the heuristic for an algorithm, telling it
  // the operands' real alignment (parameters are views into one buffer: the heuristic assumes 256
  // bytes unless told).
  void plan_lt(LtPlan& plan, const LtCall& c, const LtKey& key, cudaDataType_t in) {
    LtDescs& ds = plan.ds;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    lt_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(c.transa));
    lt_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
    lt_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(c.epilogue));
    if (c.aux != nullptr) lt_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(c.m));
    set_pointers(ds.op, c);  // before the heuristic, which takes their alignment from them
    const bool ta = c.transa == CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, in, uint64_t(ta ? c.k : c.m),
                                            uint64_t(ta ? c.m : c.k), int64_t(ta ? c.k : c.m)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, in, uint64_t(c.k), uint64_t(c.n), int64_t(c.k)));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&ds.d, CUDA_R_32F, uint64_t(c.m), uint64_t(c.n), int64_t(c.m)));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kLtWorkspaceBytes;
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (const auto& [attr, align] : alignments) {
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
    }
    cublasLtMatmulHeuristicResult_t h{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt_, ds.op, ds.a, ds.b, ds.d, ds.d, pref, 1, &h, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // a problem the heuristic cannot serve (an epilogue this GPU lacks) runs unfused
    plan.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
    plan.algo = h.algo;
  }
  template <typename T>
  static void lt_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& v) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof v));
  }
  int64_t pool_attr(cudaMemPoolAttr attr) const {
    uint64_t v = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, attr, &v));
    return int64_t(v);
  }
  int device_ = 0;
  std::string name_;
  size_t max_shared_ = 0;  // a block's opt-in shared memory limit
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  static constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
  void* lt_workspace_ = nullptr;  // cuBLASLt's workspace, allocated at its first call
  std::map<LtKey, LtPlan> lt_plans_;
  std::map<const void*, size_t> shared_allowed_;  // a tiled kernel's dynamic shared memory limit
  Scratch bf16_[3];
  Stage stage_[kStageSlots];
  int next_stage_ = 0;
  bool release_failed_ = false;
  std::set<std::tuple<int, bool, bool>> lt_reported_;  // lt_gemm outcomes logged
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<ItemBackend<CudaExec>>(device);
}

}  // namespace berth::cuda
