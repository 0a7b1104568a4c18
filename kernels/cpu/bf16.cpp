// bfloat16 rounding of fp32 values, the reference for bf16 GEMM inputs (see kernels/ops.h).
#include <cstring>

#include "kernels/ops.h"

namespace berth::cpu {

float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;  // NaN: keep it a (quiet) NaN once the low 16 bits are dropped
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even; a carry past the largest
                                      // finite value gives inf
  }
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

void round_to_bf16(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = round_to_bf16(inp[i]);
}

}  // namespace berth::cpu
