// The backend factory: the one place outside kernels/cuda that knows whether CUDA was built.
#include "kernels/backend.h"

#include "runtime/core/check.h"

#if BERTH_CUDA
#include "kernels/cuda/backend.h"
#include "kernels/cuda/device.h"
#endif

namespace berth {

bool cuda_built() { return BERTH_CUDA != 0; }

std::unique_ptr<Backend> make_backend(const std::string& device, int local_rank, int local_size) {
  BERTH_CHECK(device == "cpu" || device == "cuda" || device == "auto",
              "unknown device \"{}\": use \"auto\", \"cpu\" or \"cuda\"", device);
  if (device == "cpu") return make_cpu_backend();
#if BERTH_CUDA
  const int n = cuda::device_count();
  if (n > 0) {
    BERTH_CHECK(local_size <= n,
                "{} ranks run on this host but it has {} GPU(s): start at most {} rank(s) per host "
                "(mpirun --map-by ppr:{}:node) or set run.device = \"cpu\"",
                local_size, n, n, n);
    return cuda::make_cuda_backend(local_rank);
  }
  BERTH_CHECK(device == "auto", "device = \"cuda\" but no CUDA device is usable here: {}",
              cuda::describe_devices());
#else
  (void)local_rank, (void)local_size;
  BERTH_CHECK(device == "auto",
              "device = \"cuda\" but this berth was built without CUDA (configure with "
              "-DBERTH_CUDA=ON where nvcc is installed)");
#endif
  return make_cpu_backend();
}

}  // namespace berth
