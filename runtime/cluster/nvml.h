// Temperature and utilization of a GPU through NVML, loaded at run time (dlopen of
// libnvidia-ml.so.1), so berth needs no NVML at build time and runs where it is absent.
#pragma once

#include <optional>
#include <string>

namespace berth {

struct NvmlReading {
  unsigned temperature_c = 0;
  unsigned utilization_pct = 0;  // GPU busy over the last sample period
};

// The reading for the GPU with this UUID ("GPU-..."), or nullopt when NVML is not installed, does
// not start, or does not know the device. `why` (optional) says which.
std::optional<NvmlReading> nvml_reading(const std::string& uuid, std::string* why = nullptr);

}  // namespace berth
