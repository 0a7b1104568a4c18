// The ops of the CUDA backend other than the GEMMs: one thread per work item (thread_bodies.h), a
// block per row for the row reductions (row_bodies.h), and the tiled tensor-core attention of
// bf16 precision (flash_bodies.h), written once over an executor:
//   class Exec : public Backend {  // memory, synchronize, matmul_*, and
//     template <typename F> void launch(const char* name, int64_t n, F f);  // f(i), i < n
//     // k.run(block, team, shared memory) for each block, `threads` threads and `shared` bytes
//     template <class K> void launch_tiles(const char* name, int64_t blocks, int threads,
//                                          size_t shared, const K& k);
//     size_t max_block_shared_bytes() const;  // the most shared memory a block may have
//   };
// kernels/cuda/backend.cu instantiates it with the CUDA executor (a kernel per launch on the
// backend's stream, GEMMs in cuBLAS); tests/test_backend.cpp with a host executor (a loop per
// launch), which runs this same wiring and the bodies on any machine against
// the CPU reference. Lambdas are __host__ __device__ under nvcc (--extended-lambda).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/flash_bodies.h"
#include "kernels/cuda/row_bodies.h"
#include "kernels/cuda/thread_bodies.h"
#include "runtime/core/backend.h"
#include "runtime/core/check.h"

#if defined(__CUDACC__)
#define BERTH_LAMBDA __host__ __device__
#else
#define BERTH_LAMBDA
#endif

namespace berth::cuda {

template <class Exec>
class ItemBackend final : public Exec {
 public:
  using Exec::Exec;

  void fill(float* p, int64_t n, float value) override {
    this->launch("fill", n, [=] BERTH_LAMBDA(int64_t i) { p[i] = value; });
  }
  void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C) override {
    this->launch("encoder_forward", int64_t(N) * C, [=] BERTH_LAMBDA(int64_t i) {
      body::encoder_forward(i, out, tokens, positions, wte, wpe, C);
    });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C) override {
    this->launch("encoder_backward", int64_t(N) * C, [=] BERTH_LAMBDA(int64_t i) {
      body::encoder_backward(i, dwte, dwpe, dout, tokens, positions, C);
    });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    launch_rows("layernorm_forward",
                rows::LayerNormForward{out, mean, rstd, inp, weight, bias, N, C});
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    launch_rows("layernorm_backward",
                rows::LayerNormBackward{dinp, dout, inp, weight, mean, rstd, N, C});
    const int parts = body::column_parts(N);
    DeviceBuffer<float> part(*this, 2 * int64_t(parts) * C);
    float* pdw = part.data();
    float* pdb = pdw + int64_t(parts) * C;
    this->launch("layernorm_param_partials", int64_t(parts) * C, [=] BERTH_LAMBDA(int64_t i) {
      body::layernorm_param_partials(i, pdw, pdb, dout, inp, mean, rstd, N, C);
    });
    this->launch("layernorm_dweight", C, [=] BERTH_LAMBDA(int64_t c) {
      body::add_column_parts(int(c), dweight, pdw, parts, C);
    });
    this->launch("layernorm_dbias", C, [=] BERTH_LAMBDA(int64_t c) {
      body::add_column_parts(int(c), dbias, pdb, parts, C);
    });
  }
  void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu_seqlens,
                         const int32_t* cu_seqlens_host, int S, int C, int NH) override {
    DeviceBuffer<int64_t> offsets = att_offsets(cu_seqlens_host, S, NH);
    const int64_t* off = offsets.data();
    const int N = cu_seqlens_host[S];
    this->launch("attention_forward", int64_t(N) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_forward(item, out, att, qkv, cu_seqlens, off, S, C, NH);
    });
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, const int32_t* cu_seqlens,
                          const int32_t* cu_seqlens_host, int S, int C, int NH) override {
    DeviceBuffer<int64_t> offsets = att_offsets(cu_seqlens_host, S, NH);
    const int64_t* off = offsets.data();
    const int N = cu_seqlens_host[S];
    this->zero(dqkv, size_t(N) * 3 * size_t(C) * sizeof(float));
    this->launch("attention_backward", int64_t(N) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_backward(item, dqkv, datt, dout, qkv, att, cu_seqlens, off, S, C, NH);
    });
  }
  void attention_varlen_forward(float* out, float* lse, const float* qkv, const int32_t* cu,
                                const int32_t* cu_host, int S, int C, int NH) override {
    check_head_size(C, NH);
    const int N = cu_host[S];
    if (tensor_core_attention(C / NH))
      return flash_forward("attention_varlen_forward_bf16", out, lse,
                           flash::Varlen{qkv, cu, S, N, C}, NH);
    switch (C / NH) {  // the common head sizes with their accumulator in registers
      case 64:
        return varlen_forward_fp32<64>(out, lse, qkv, cu, S, N, C, NH);
      case 128:
        return varlen_forward_fp32<128>(out, lse, qkv, cu, S, N, C, NH);
      default:
        return varlen_forward_fp32<0>(out, lse, qkv, cu, S, N, C, NH);
    }
  }
  template <int kHS>
  void varlen_forward_fp32(float* out, float* lse, const float* qkv, const int32_t* cu, int S,
                           int N, int C, int NH) {
    this->launch("attention_varlen_forward", int64_t(N) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_varlen_forward<kHS>(item, out, lse, qkv, cu, S, C, NH);
    });
  }
  void attention_varlen_backward(float* dqkv, const float* dout, const float* out,
                                 const float* lse, const float* qkv, const int32_t* cu,
                                 const int32_t* cu_host, int S, int C, int NH) override {
    const int N = cu_host[S];
    this->zero(dqkv, size_t(N) * 3 * size_t(C) * sizeof(float));
    if (tensor_core_attention(C / NH))
      return flash_backward("attention_varlen_backward_bf16", dqkv, dqkv + C, dqkv + 2 * C,
                            3 * int64_t(C), dout, out, lse, flash::Varlen{qkv, cu, S, N, C}, NH);
    const DeviceBuffer<float> delta = row_dots(dout, out, N, C, NH);
    const float* dl = delta.data();
    this->launch("attention_varlen_backward_dq", int64_t(N) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_varlen_backward_dq(item, dqkv, dout, lse, dl, qkv, cu, S, C, NH);
    });
    this->launch("attention_varlen_backward_dkv", int64_t(N) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_varlen_backward_dkv(item, dqkv, dout, lse, dl, qkv, cu, S, C, NH);
    });
  }
  // The online-softmax kernels: never an L×L matrix in device memory.
  bool prefers_flash_attention() const override { return true; }
  bool attention_on_tensor_cores(int head_size) const override {
    return tensor_core_attention(head_size);
  }
  void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const int32_t* q_seq, const int32_t* q_pos,
                               const int32_t* k_seq, const int32_t* k_pos, int nq, int nk, int C,
                               int NH) override {
    check_head_size(C, NH);
    if (tensor_core_attention(C / NH))
      return flash_forward("attention_block_forward_bf16", out, lse,
                           flash::Block{q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C}, NH);
    switch (C / NH) {
      case 64:
        return block_forward_fp32<64>(out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C, NH);
      case 128:
        return block_forward_fp32<128>(out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C,
                                       NH);
      default:
        return block_forward_fp32<0>(out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C, NH);
    }
  }
  template <int kHS>
  void block_forward_fp32(float* out, float* lse, const float* q, const float* k, const float* v,
                          const int32_t* q_seq, const int32_t* q_pos, const int32_t* k_seq,
                          const int32_t* k_pos, int nq, int nk, int C, int NH) {
    this->launch("attention_block_forward", int64_t(nq) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_block_forward<kHS>(item, out, lse, q, k, v, q_seq, q_pos, k_seq, k_pos, nk, C,
                                         NH);
    });
  }
  void attention_lse_merge(float* out, float* lse, const float* out_b, const float* lse_b, int nq,
                           int C, int NH) override {
    this->launch("attention_lse_merge", int64_t(nq) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_lse_merge(item, out, lse, out_b, lse_b, C, NH);
    });
  }
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q,
                                const float* k, const float* v, const int32_t* q_seq,
                                const int32_t* q_pos, const int32_t* k_seq, const int32_t* k_pos,
                                int nq, int nk, int C, int NH) override {
    check_head_size(C, NH);
    if (tensor_core_attention(C / NH))
      return flash_backward("attention_block_backward_bf16", dq, dk, dv, C, dout, out, lse,
                            flash::Block{q, k, v, q_seq, q_pos, k_seq, k_pos, nq, nk, C}, NH);
    const DeviceBuffer<float> delta = row_dots(dout, out, nq, C, NH);
    const float* dl = delta.data();
    this->launch("attention_block_backward_dq", int64_t(nq) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_block_backward_dq(item, dq, dout, lse, dl, q, k, v, q_seq, q_pos, k_seq,
                                        k_pos, nk, C, NH);
    });
    this->launch("attention_block_backward_dkv", int64_t(nk) * NH, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_block_backward_dkv(item, dk, dv, dout, lse, dl, q, k, v, q_seq, q_pos, k_seq,
                                         k_pos, nq, C, NH);
    });
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    this->launch("gelu_forward", n,
           [=] BERTH_LAMBDA(int64_t i) { body::gelu_forward(i, out, inp); });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    this->launch("gelu_backward", n,
           [=] BERTH_LAMBDA(int64_t i) { body::gelu_backward(i, dinp, inp, dout); });
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) override {
    this->launch("residual_forward", n,
           [=] BERTH_LAMBDA(int64_t i) { body::residual_forward(i, out, a, b); });
  }
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                            int V, int Vp) override {
    launch_rows("crossentropy_forward",
                rows::CrossEntropyForward{losses, logits, targets, N, V, Vp});
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int N, int V, int Vp) override {
    launch_rows("crossentropy_backward",
                rows::CrossEntropyBackward{dlogits, logits, targets, dloss, N, V, Vp});
  }
  void vocab_embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                               const float* wte_local, const float* wpe, int N, int C,
                               int Vp_local, int offset) override {
    this->launch("vocab_embedding_forward", int64_t(N) * C, [=] BERTH_LAMBDA(int64_t i) {
      body::vocab_embedding_forward(i, out, tokens, positions, wte_local, wpe, C, Vp_local,
                                    offset);
    });
  }
  void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout,
                                const int32_t* tokens, const int32_t* positions, int N, int C,
                                int Vp_local, int offset) override {
    this->launch("vocab_embedding_backward", int64_t(N) * C, [=] BERTH_LAMBDA(int64_t i) {
      body::vocab_embedding_backward(i, dwte_local, dwpe, dout, tokens, positions, C, Vp_local,
                                     offset);
    });
  }
  void vocab_ce_max(float* mx, const float* logits_local, int N, int real, int Vp_local) override {
    launch_rows("vocab_ce_max", rows::VocabCeMax{mx, logits_local, N, real, Vp_local});
  }
  void vocab_ce_partials(float* st, const float* logits_local, const float* mx,
                         const int32_t* targets, int N, int real, int Vp_local,
                         int offset) override {
    launch_rows("vocab_ce_partials",
                rows::VocabCePartials{st, logits_local, mx, targets, N, real, Vp_local, offset});
  }
  void vocab_ce_finish(float* losses, float* lse, const float* mx, const float* st,
                       const int32_t* targets, int N) override {
    this->launch("vocab_ce_finish", N, [=] BERTH_LAMBDA(int64_t n) {
      body::vocab_ce_finish(int(n), losses, lse, mx, st, targets);
    });
  }
  void vocab_ce_backward(float* dlogits_local, const float* logits_local, const float* lse,
                         const int32_t* targets, float dloss, int N, int real, int Vp_local,
                         int offset) override {
    this->launch("vocab_ce_backward", int64_t(N) * Vp_local, [=] BERTH_LAMBDA(int64_t i) {
      body::vocab_ce_backward(i, dlogits_local, logits_local, lse, targets, dloss, real, Vp_local,
                              offset);
    });
  }
  void bias_add(float* out, const float* bias, int N, int OC) override {
    this->launch("bias_add", int64_t(N) * OC,
                 [=] BERTH_LAMBDA(int64_t i) { body::add_bias(i, out, bias, OC); });
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int64_t t) override {
    const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(beta1), double(t))));
    const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(beta2), double(t))));
    this->launch("adamw_update", n, [=] BERTH_LAMBDA(int64_t i) {
      body::adamw_update(i, params, grads, m, v, lr, beta1, beta2, eps, weight_decay, grad_scale,
                         inv_bc1, inv_bc2);
    });
  }
  // A block per contiguous part (at most 1024, of at least 16 Ki values), the parts' sums added
  // on the host in order: deterministic.
  double sum_squares(const float* x, int64_t n) override {
    if (n <= 0) return 0;
    const int parts = int(std::min<int64_t>(1024, (n + kSumSquaresPart - 1) / kSumSquaresPart));
    DeviceBuffer<double> partial(*this, parts);
    launch_rows("sum_squares", rows::SumSquares{partial.data(), x, n, parts});
    std::vector<double> host(size_t(parts), 0.0);
    this->download(host.data(), partial.data(), partial.bytes());
    double total = 0;
    for (double d : host) total += d;
    return total;
  }

 public:  // (an extended lambda's enclosing function may not be private)
  // The tiled tensor-core kernels of flash_bodies.h over a token source, at its head size.
  template <class Src>
  void flash_forward(const char* name, float* out, float* lse, const Src& src, int NH) {
    switch (src.width() / NH) {
      case 32:
        return launch_flash(name, flash::Forward<32, Src>{out, lse, src, NH});
      case 64:
        return launch_flash(name, flash::Forward<64, Src>{out, lse, src, NH});
      case 80:
        return launch_flash(name, flash::Forward<80, Src>{out, lse, src, NH});
      case 96:
        return launch_flash(name, flash::Forward<96, Src>{out, lse, src, NH});
      default:
        return launch_flash(name, flash::Forward<128, Src>{out, lse, src, NH});
    }
  }
  // delta (n, NH) = rowsum(dout ∘ out) of each (token, head): the attention backward's row term.
  DeviceBuffer<float> row_dots(const float* dout, const float* out, int n, int C, int NH) {
    const int64_t items = int64_t(n) * NH;
    DeviceBuffer<float> delta(*this, items);
    float* dl = delta.data();
    this->launch("attention_row_dot", items, [=] BERTH_LAMBDA(int64_t item) {
      body::attention_row_dot(item, dl, dout, out, C, NH);
    });
    return delta;
  }
  // dq, dk, dv (+=) with `dstride` floats a row
  template <class Src>
  void flash_backward(const char* name, float* dq, float* dk, float* dv, int64_t dstride,
                      const float* dout, const float* out, const float* lse, const Src& src,
                      int NH) {
    const int C = src.width();
    const DeviceBuffer<float> delta = row_dots(dout, out, src.nq(), C, NH);
    const float* dl = delta.data();
    switch (C / NH) {
      case 32:
        return flash_backward_at<32>(name, dq, dk, dv, dstride, dout, lse, dl, src, NH);
      case 64:
        return flash_backward_at<64>(name, dq, dk, dv, dstride, dout, lse, dl, src, NH);
      case 80:
        return flash_backward_at<80>(name, dq, dk, dv, dstride, dout, lse, dl, src, NH);
      case 96:
        return flash_backward_at<96>(name, dq, dk, dv, dstride, dout, lse, dl, src, NH);
      default:
        return flash_backward_at<128>(name, dq, dk, dv, dstride, dout, lse, dl, src, NH);
    }
  }
  // The tiled backward at head size HS with the query tile backward_query_tile gives it.
  template <int HS, class Src>
  void flash_backward_at(const char* name, float* dq, float* dk, float* dv, int64_t dstride,
                         const float* dout, const float* lse, const float* delta, const Src& src,
                         int NH) {
    if (backward_query_tile(HS) == 64)
      return launch_flash(name,
                          flash::Backward<HS, Src>{dq, dk, dv, dstride, dout, lse, delta, src, NH});
    return launch_flash(
        name, flash::Backward<HS, Src, 32>{dq, dk, dv, dstride, dout, lse, delta, src, NH});
  }
  // The query tile of the tiled backward at this head size: 64, or 32 where 64 does not fit the
  // device's shared memory but 32 does (head size 128 on an A100: 150 KiB instead of 191.5); 0
  // where neither fits or the kernels do not take the head size.
  int backward_query_tile(int head_size) const {
    switch (head_size) {
      case 32:
        return query_tile_that_fits<32>();
      case 64:
        return query_tile_that_fits<64>();
      case 80:
        return query_tile_that_fits<80>();
      case 96:
        return query_tile_that_fits<96>();
      case 128:
        return query_tile_that_fits<128>();
      default:
        return 0;
    }
  }
  //
  // BERTH_FLASH_BACKWARD_QUERY_TILE=32 takes 32 where both fit: a block of 64-query tiles (127.5
  // KiB at head size 64) leaves room for one block of 4 warps a 228 KiB SM, two of 32-query tiles
  // (94 KiB) fit. Which is faster is the GPU's to say: bench_gpu_ops times both.
  template <int HS>
  int query_tile_that_fits() const {
    using V = flash::Varlen;  // the regions do not depend on the source
    const size_t most = this->max_block_shared_bytes();
    const bool fits64 = flash::Backward<HS, V>::shared_bytes() <= most;
    const bool fits32 = flash::Backward<HS, V, 32>::shared_bytes() <= most;
    const char* asked = std::getenv("BERTH_FLASH_BACKWARD_QUERY_TILE");
    if (fits32 && asked != nullptr && std::string(asked) == "32") return 32;
    return fits64 ? 64 : fits32 ? 32 : 0;
  }
  template <class K>
  void launch_flash(const char* name, const K& k) {
    this->launch_tiles(name, k.blocks(), flash::kThreads, K::shared_bytes(), k);
  }
  // A kernel of row_bodies.h: a block per row (or part).
  template <class K>
  void launch_rows(const char* name, const K& k) {
    this->launch_tiles(name, k.blocks(), rows::kThreads, K::shared_bytes(), k);
  }

 private:
  // bf16 precision runs the varlen attention and ring attention's blocks on tensor cores
  // (flash_bodies.h) for the head sizes those kernels take, where a block's shared memory fits
  // the device (the backward's, even with 32-query tiles, is larger than the forward's);
  // otherwise, and always in fp32, the fp32 kernels of thread_bodies.h.
  bool tensor_core_attention(int head_size) const {
    return this->matmul_precision() == MatmulPrecision::kBf16 &&
           tiled_attention_head_size(head_size) && backward_query_tile(head_size) > 0;
  }
  // att_offsets[s] = Σ_{s' < s} NH·L_{s'}², on the device.
  DeviceBuffer<int64_t> att_offsets(const int32_t* cu_host, int S, int NH) {
    std::vector<int64_t> off(size_t(S) + 1, 0);
    for (int s = 0; s < S; s++) {
      const int64_t L = cu_host[s + 1] - cu_host[s];
      off[size_t(s) + 1] = off[size_t(s)] + int64_t(NH) * L * L;
    }
    DeviceBuffer<int64_t> d(*this, S + 1);
    this->upload(d.data(), off.data(), d.bytes());  // `off` may go: upload consumed it
    return d;
  }
  static constexpr int64_t kSumSquaresPart = 16 * 1024;
  static void check_head_size(int C, int NH) {
    BERTH_CHECK(C / NH <= body::kMaxHeadSize,
                "cuda attention: head size {} is above the {} these kernels support", C / NH,
                body::kMaxHeadSize);
  }
};

}  // namespace berth::cuda
