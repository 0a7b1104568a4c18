// What the CUDA runtime sees on this host. Declared without CUDA types so host code can call it;
// defined only when berth is built with CUDA (BERTH_CUDA=1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// One line per device: "cuda:0 NVIDIA H200, 139.8 GiB, compute 9.0", or the reason none is usable.
std::string describe_devices();

struct DeviceInfo {
  int index = 0;
  std::string name;     // "NVIDIA H200"
  std::string uuid;     // "GPU-" + 32 hex digits grouped 8-4-4-4-12, as nvidia-smi prints it
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // cudaMemGetInfo on that device now
};
// Every visible device (empty when there is no driver or no device; never throws for that).
std::vector<DeviceInfo> device_inventory();

}  // namespace berth::cuda
