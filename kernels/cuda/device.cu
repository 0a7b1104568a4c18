// Device discovery through the CUDA runtime (see device.h).
#include <fmt/format.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"

namespace berth::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string describe_devices() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device ({})\n", cudaGetErrorString(err));
  }
  std::string out;
  for (int d = 0; d < n; d++) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    out += fmt::format("cuda:{} {}, {:.1f} GiB, compute {}.{}\n", d, prop.name,
                       double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), prop.major,
                       prop.minor);
  }
  return out;
}

}  // namespace berth::cuda
