// The CUDA backend (fp32 kernels, cuBLAS GEMMs, a caching memory pool, one stream). Declared
// without CUDA types; defined only when berth is built with CUDA (BERTH_CUDA=1).
#pragma once

#include <memory>

#include "runtime/core/backend.h"

namespace berth::cuda {

// A backend on device `device` (throws berth::Error naming the CUDA error when it cannot start).
std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace berth::cuda
