#include "runtime/core/backend.h"

#include "runtime/core/check.h"

namespace berth {

const char* matmul_precision_name(MatmulPrecision p) {
  return p == MatmulPrecision::kBf16 ? "bf16" : "fp32";
}

MatmulPrecision parse_matmul_precision(const std::string& name) {
  if (name == "fp32") return MatmulPrecision::kFp32;
  if (name == "bf16") return MatmulPrecision::kBf16;
  BERTH_FAIL("unknown run.precision \"{}\"; use \"fp32\" or \"bf16\"", name);
}

void Backend::matmul_gelu_forward(float* out, float* pre, const float* inp, const float* weight,
                                  const float* bias, int N, int IC, int OC) {
  matmul_forward(pre, inp, weight, bias, N, IC, OC);
  gelu_forward(out, pre, int64_t(N) * OC);
}

void Backend::gelu_matmul_backward(float* dpre, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, const float* pre, int N,
                                   int IC, int OC) {
  matmul_backward(dpre, dweight, dbias, dout, inp, weight, N, IC, OC);
  if (dpre != nullptr) gelu_backward(dpre, pre, dpre, int64_t(N) * IC);
}

}  // namespace berth
