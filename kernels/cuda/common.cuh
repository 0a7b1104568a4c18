// Shared helpers for the CUDA kernels: the CUDA_CHECK macro (throws berth::Error with the
// expression, file:line, CUDA's message and rank@host) and CEIL_DIV for launch grids.
#pragma once

#include <cuda_runtime.h>

#include "runtime/core/check.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    const cudaError_t berth_cuda_err_ = (expr);                                            \
    if (berth_cuda_err_ != cudaSuccess) {                                                  \
      throw ::berth::Error(::fmt::format("CUDA error {} ({}) in `{}` at {}:{} on {}",      \
                                         cudaGetErrorName(berth_cuda_err_),                \
                                         cudaGetErrorString(berth_cuda_err_), #expr,       \
                                         __FILE__, __LINE__, ::berth::identity()));        \
    }                                                                                      \
  } while (0)
