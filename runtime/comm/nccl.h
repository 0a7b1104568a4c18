// The Communicator on device buffers (NCCL), and the factory that picks MPI or NCCL for a backend.
// Declared without CUDA or NCCL types; the NCCL communicator is built when CUDA is on and NCCL is
// found (BERTH_NCCL=1).
#pragma once

#include <memory>

#include "runtime/comm/communicator.h"
#include "runtime/core/backend.h"

namespace berth {

// Whether this binary has the NCCL communicator.
bool nccl_built();

// The world communicator over MPI_COMM_WORLD's ranks on the device of `be` (a CUDA backend):
// rank 0 creates an ncclUniqueId and broadcasts it over MPI; split() is ncclCommSplit. Calls are
// queued on the communicator's own stream, which waits (an event) for the work queued on `be`'s
// stream before each call, and `be`'s stream waits for the call's result, so callers see the same
// ordering as on MPI. Host buffers (e.g. a loss on the host) are staged through device memory and
// waited for. Collective over MPI_COMM_WORLD. Throws berth::Error when NCCL is not built.
std::unique_ptr<Communicator> make_nccl_world(Backend& be);

// MPI for the CPU backend, NCCL for the CUDA backend (an Error naming the reason when this binary
// has no NCCL). Collective over MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_world(Backend& be);

}  // namespace berth
