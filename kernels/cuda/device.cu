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

std::vector<DeviceInfo> device_inventory() {
  std::vector<DeviceInfo> out;
  const int n = device_count();
  int current = 0;
  if (n > 0) CUDA_CHECK(cudaGetDevice(&current));
  for (int d = 0; d < n; d++) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    DeviceInfo info;
    info.index = d;
    info.name = prop.name;
    const unsigned char* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    info.uuid = "GPU-";
    for (int i = 0; i < 16; i++) {
      info.uuid += fmt::format("{:02x}", u[i]);
      if (i == 3 || i == 5 || i == 7 || i == 9) info.uuid += "-";
    }
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    info.total_bytes = int64_t(total_b);
    info.free_bytes = int64_t(free_b);
    out.push_back(info);
  }
  if (n > 0) CUDA_CHECK(cudaSetDevice(current));
  return out;
}

}  // namespace berth::cuda
