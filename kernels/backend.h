// Choosing a Backend (runtime/core/backend.h): the CPU reference, or CUDA when built with it and a
// device is visible.
#pragma once

#include <memory>
#include <string>

#include "runtime/core/backend.h"

namespace berth {

// The CPU backend: host memory, the kernels of kernels/cpu.
std::unique_ptr<Backend> make_cpu_backend();
// One process-wide CPU backend (host code that needs the ops on host buffers).
Backend& cpu_backend();

// Whether this binary was built with the CUDA backend.
bool cuda_built();
// `device`: "cpu", "cuda" (throws berth::Error naming the reason when CUDA is not built or no
// device is visible) or "auto" (CUDA when usable, else CPU). A CUDA backend takes GPU
// `local_rank` of the host; `local_size` ranks on the host need as many GPUs (an error says so:
// two ranks on one GPU cannot share an NCCL communicator).
std::unique_ptr<Backend> make_backend(const std::string& device, int local_rank,
                                      int local_size = 1);

// The GPU (an index among the `visible` ones) that local rank `local_rank` of `local_size` takes:
// its local rank when the host shows every rank all of its GPUs, or the only one visible when the
// launcher bound one GPU to each rank (`bound_per_rank`: CUDA_VISIBLE_DEVICES set, as Slurm's
// --gpus-per-task=1 or --gpu-bind does). Throws berth::Error when the ranks outnumber the GPUs.
int cuda_device_for_rank(int visible, int local_rank, int local_size, bool bound_per_rank);

}  // namespace berth
