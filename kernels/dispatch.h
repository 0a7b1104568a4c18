// The op table over the model's scalar, for host code written once for float and double (GPT<T>,
// the tensor-parallel primitives): float runs on a Backend (the process-wide CPU backend when
// none is given), double on the CPU reference (the fp64 model of the gradient tests).
// Shapes and semantics: kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "runtime/core/check.h"

namespace berth {

template <typename T>
class Ops;

template <>
class Ops<float> {
 public:
  explicit Ops(Backend* be = nullptr) : be_(be != nullptr ? be : &cpu_backend()) {}
  Backend& backend() const { return *be_; }
  Backend& memory() const { return *be_; }  // where scratch buffers for these ops live

  void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions,
                       const float* wte, const float* wpe, int N, int C) const {
    be_->encoder_forward(out, tokens, positions, wte, wpe, N, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C) const {
    be_->encoder_backward(dwte, dwpe, dout, tokens, positions, N, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const {
    be_->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const {
    be_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int IC,
                      int OC) const {
    be_->matmul_forward(out, inp, w, b, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const {
    be_->matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void matmul_gelu_forward(float* out, float* pre, const float* inp, const float* w, const float* b,
                           int N, int IC, int OC) const {
    be_->matmul_gelu_forward(out, pre, inp, w, b, N, IC, OC);
  }
  void gelu_matmul_backward(float* dpre, float* dw, float* db, const float* dout, const float* inp,
                            const float* w, const float* pre, int N, int IC, int OC) const {
    be_->gelu_matmul_backward(dpre, dw, db, dout, inp, w, pre, N, IC, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, const int32_t* cu,
                         const int32_t* cu_host, int S, int C, int NH) const {
    be_->attention_forward(out, att, qkv, cu, cu_host, S, C, NH);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, const int32_t* cu, const int32_t* cu_host, int S,
                          int C, int NH) const {
    be_->attention_backward(dqkv, datt, dout, qkv, att, cu, cu_host, S, C, NH);
  }
  void attention_varlen_forward(float* out, float* lse, const float* qkv, const int32_t* cu,
                                const int32_t* cu_host, int S, int C, int NH) const {
    be_->attention_varlen_forward(out, lse, qkv, cu, cu_host, S, C, NH);
  }
  void attention_varlen_backward(float* dqkv, const float* dout, const float* out,
                                 const float* lse, const float* qkv, const int32_t* cu,
                                 const int32_t* cu_host, int S, int C, int NH) const {
    be_->attention_varlen_backward(dqkv, dout, out, lse, qkv, cu, cu_host, S, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) const {
    be_->gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) const {
    be_->gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) const {
    be_->residual_forward(out, a, b, n);
  }
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                            int V, int Vp) const {
    be_->crossentropy_forward(losses, logits, targets, N, V, Vp);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int N, int V, int Vp) const {
    be_->crossentropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }

  void vocab_embedding_forward(float* out, const int32_t* tokens, const int32_t* positions,
                               const float* wte_local, const float* wpe, int N, int C,
                               int Vp_local, int offset) const {
    be_->vocab_embedding_forward(out, tokens, positions, wte_local, wpe, N, C, Vp_local, offset);
  }
  void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout,
                                const int32_t* tokens, const int32_t* positions, int N, int C,
                                int Vp_local, int offset) const {
    be_->vocab_embedding_backward(dwte_local, dwpe, dout, tokens, positions, N, C, Vp_local,
                                  offset);
  }
  void vocab_ce_max(float* mx, const float* logits_local, int N, int real, int Vp_local) const {
    be_->vocab_ce_max(mx, logits_local, N, real, Vp_local);
  }
  void vocab_ce_partials(float* st, const float* logits_local, const float* mx,
                         const int32_t* targets, int N, int real, int Vp_local,
                         int offset) const {
    be_->vocab_ce_partials(st, logits_local, mx, targets, N, real, Vp_local, offset);
  }
  void vocab_ce_finish(float* losses, float* lse, const float* mx, const float* st,
                       const int32_t* targets, int N) const {
    be_->vocab_ce_finish(losses, lse, mx, st, targets, N);
  }
  void vocab_ce_backward(float* dlogits_local, const float* logits_local, const float* lse,
                         const int32_t* targets, float dloss, int N, int real, int Vp_local,
                         int offset) const {
    be_->vocab_ce_backward(dlogits_local, logits_local, lse, targets, dloss, N, real, Vp_local,
                           offset);
  }
  void bias_add(float* out, const float* bias, int N, int OC) const {
    be_->bias_add(out, bias, N, OC);
  }

 private:
  Backend* be_;
};

template <>
class Ops<double> {
 public:
  explicit Ops(Backend* be = nullptr) {
    BERTH_CHECK(be == nullptr || be->kind() == DeviceKind::kCpu,
                "the fp64 model runs on the CPU reference only, not on {}", be->name());
  }
  Backend& memory() const { return cpu_backend(); }

  void encoder_forward(double* out, const int32_t* tokens, const int32_t* positions,
                       const double* wte, const double* wpe, int N, int C) const {
    cpu::encoder_forward(out, tokens, positions, wte, wpe, N, C);
  }
  void encoder_backward(double* dwte, double* dwpe, const double* dout, const int32_t* tokens,
                        const int32_t* positions, int N, int C) const {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, positions, N, C);
  }
  void layernorm_forward(double* out, double* mean, double* rstd, const double* inp,
                         const double* w, const double* b, int N, int C) const {
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(double* dinp, double* dw, double* db, const double* dout,
                          const double* inp, const double* w, const double* mean,
                          const double* rstd, int N, int C) const {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(double* out, const double* inp, const double* w, const double* b, int N,
                      int IC, int OC) const {
    cpu::matmul_forward(out, inp, w, b, N, IC, OC);
  }
  void matmul_backward(double* dinp, double* dw, double* db, const double* dout,
                       const double* inp, const double* w, int N, int IC, int OC) const {
    cpu::matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void matmul_gelu_forward(double* out, double* pre, const double* inp, const double* w,
                           const double* b, int N, int IC, int OC) const {
    cpu::matmul_forward(pre, inp, w, b, N, IC, OC);
    cpu::gelu_forward(out, pre, int64_t(N) * OC);
  }
  void gelu_matmul_backward(double* dpre, double* dw, double* db, const double* dout,
                            const double* inp, const double* w, const double* pre, int N, int IC,
                            int OC) const {
    cpu::matmul_backward(dpre, dw, db, dout, inp, w, N, IC, OC);
    cpu::gelu_backward(dpre, pre, dpre, int64_t(N) * IC);
  }
  void attention_forward(double* out, double* att, const double* qkv, const int32_t* cu,
                         const int32_t*, int S, int C, int NH) const {
    cpu::attention_forward(out, att, qkv, cu, S, C, NH);
  }
  void attention_backward(double* dqkv, double* datt, const double* dout, const double* qkv,
                          const double* att, const int32_t* cu, const int32_t*, int S, int C,
                          int NH) const {
    cpu::attention_backward(dqkv, datt, dout, qkv, att, cu, S, C, NH);
  }
  void gelu_forward(double* out, const double* inp, int64_t n) const {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(double* dinp, const double* inp, const double* dout, int64_t n) const {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(double* out, const double* a, const double* b, int64_t n) const {
    cpu::residual_forward(out, a, b, n);
  }
  void crossentropy_forward(double* losses, const double* logits, const int32_t* targets, int N,
                            int V, int Vp) const {
    cpu::crossentropy_forward(losses, logits, targets, N, V, Vp);
  }
  void crossentropy_backward(double* dlogits, const double* logits, const int32_t* targets,
                             double dloss, int N, int V, int Vp) const {
    cpu::crossentropy_backward(dlogits, logits, targets, dloss, N, V, Vp);
  }
  void vocab_embedding_forward(double* out, const int32_t* tokens, const int32_t* positions,
                               const double* wte_local, const double* wpe, int N, int C,
                               int Vp_local, int offset) const {
    cpu::vocab_embedding_forward(out, tokens, positions, wte_local, wpe, N, C, Vp_local, offset);
  }
  void vocab_embedding_backward(double* dwte_local, double* dwpe, const double* dout,
                                const int32_t* tokens, const int32_t* positions, int N, int C,
                                int Vp_local, int offset) const {
    cpu::vocab_embedding_backward(dwte_local, dwpe, dout, tokens, positions, N, C, Vp_local,
                                  offset);
  }
  void vocab_ce_max(double* mx, const double* logits_local, int N, int real,
                    int Vp_local) const {
    cpu::vocab_ce_max(mx, logits_local, N, real, Vp_local);
  }
  void vocab_ce_partials(double* st, const double* logits_local, const double* mx,
                         const int32_t* targets, int N, int real, int Vp_local,
                         int offset) const {
    cpu::vocab_ce_partials(st, logits_local, mx, targets, N, real, Vp_local, offset);
  }
  void vocab_ce_finish(double* losses, double* lse, const double* mx, const double* st,
                       const int32_t* targets, int N) const {
    cpu::vocab_ce_finish(losses, lse, mx, st, targets, N);
  }
  void vocab_ce_backward(double* dlogits_local, const double* logits_local, const double* lse,
                         const int32_t* targets, double dloss, int N, int real, int Vp_local,
                         int offset) const {
    cpu::vocab_ce_backward(dlogits_local, logits_local, lse, targets, dloss, N, real, Vp_local,
                           offset);
  }
  void bias_add(double* out, const double* bias, int N, int OC) const {
    cpu::bias_add(out, bias, N, OC);
  }
};

}  // namespace berth
