// The backend factory: the one place outside kernels/cuda that knows whether CUDA was built.
#include "kernels/backend.h"

#include <cstdlib>

#include "runtime/core/check.h"

#if BERTH_CUDA
#include "kernels/cuda/backend.h"
#include "kernels/cuda/device.h"
#endif

namespace berth {

bool cuda_built() { return BERTH_CUDA != 0; }

int cuda_device_for_rank(int visible, int local_rank, int local_size, bool bound_per_rank) {
  BERTH_CHECK(local_rank >= 0 && local_rank < local_size, "local rank {} of {} ranks", local_rank,
              local_size);
  if (visible >= local_size) return local_rank;
  // One GPU each, chosen by the launcher: every rank sees its own as device 0. (Ranks that were
  // all shown the same one GPU are refused by NCCL, which names the duplicate device.)
  if (visible == 1 && bound_per_rank) return 0;
  BERTH_FAIL(
      "{} ranks run on this host but this rank sees {} GPU(s): start at most {} rank(s) per host "
      "(mpirun --map-by ppr:{}:node), bind one GPU to each rank (srun --gpus-per-task=1), or set "
      "run.device = \"cpu\"",
      local_size, visible, visible, visible);
}

std::unique_ptr<Backend> make_backend(const std::string& device, int local_rank, int local_size) {
  BERTH_CHECK(device == "cpu" || device == "cuda" || device == "auto",
              "unknown device \"{}\": use \"auto\", \"cpu\" or \"cuda\"", device);
  if (device == "cpu") return make_cpu_backend();
#if BERTH_CUDA
  const int n = cuda::device_count();
  if (n > 0) {
    const char* bound = std::getenv("CUDA_VISIBLE_DEVICES");
    return cuda::make_cuda_backend(
        cuda_device_for_rank(n, local_rank, local_size, bound != nullptr && *bound != '\0'));
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
