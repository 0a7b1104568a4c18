#include "runtime/cluster/nvml.h"

#include <dlfcn.h>

namespace berth {
namespace {

// The few NVML entry points used, with their C signatures (nvml.h, NVML API version 2).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned gpu, memory;
};
constexpr int kNvmlTemperatureGpu = 0;

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  std::string error;

  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = "NVML not installed (libnvidia-ml.so.1)";
      return;
    }
    init = reinterpret_cast<decltype(init)>(dlsym(lib, "nvmlInit_v2"));
    shutdown = reinterpret_cast<decltype(shutdown)>(dlsym(lib, "nvmlShutdown"));
    by_uuid = reinterpret_cast<decltype(by_uuid)>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
    temperature = reinterpret_cast<decltype(temperature)>(dlsym(lib, "nvmlDeviceGetTemperature"));
    utilization =
        reinterpret_cast<decltype(utilization)>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    if (!init || !shutdown || !by_uuid || !temperature || !utilization) {
      error = "NVML lacks an expected function";
    } else if (init() != 0) {
      error = "nvmlInit failed (no driver?)";
    }
  }
  ~Nvml() {
    if (lib && error.empty()) shutdown();
    if (lib) dlclose(lib);
  }
};

}  // namespace

std::optional<NvmlReading> nvml_reading(const std::string& uuid, std::string* why) {
  static Nvml nvml;
  auto fail = [&](const std::string& w) -> std::optional<NvmlReading> {
    if (why) *why = w;
    return std::nullopt;
  };
  if (!nvml.error.empty()) return fail(nvml.error);
  nvmlDevice_t dev = nullptr;
  if (nvml.by_uuid(uuid.c_str(), &dev) != 0) return fail("NVML does not know " + uuid);
  NvmlReading r;
  nvmlUtilization_t u{};
  if (nvml.temperature(dev, kNvmlTemperatureGpu, &r.temperature_c) != 0 ||
      nvml.utilization(dev, &u) != 0) {
    return fail("NVML could not read " + uuid);
  }
  r.utilization_pct = u.gpu;
  return r;
}

}  // namespace berth
