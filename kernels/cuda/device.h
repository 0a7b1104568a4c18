// What the CUDA runtime sees on this host. Declared without CUDA types so host code can call it;
// defined only when berth is built with CUDA (BERTH_CUDA=1).
#pragma once

#include <string>

namespace berth::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// One line per device: "cuda:0 NVIDIA H200, 139.8 GiB, compute 9.0", or the reason none is usable.
std::string describe_devices();

}  // namespace berth::cuda
