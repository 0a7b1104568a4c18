// The Communicator on device buffers (NCCL), and the factory that picks MPI or NCCL for a backend.
// Declared without CUDA or NCCL types; the NCCL communicator is built when CUDA is on and NCCL is
// found (BERTH_NCCL=1).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "runtime/comm/communicator.h"
#include "runtime/core/backend.h"

namespace berth {

// Whether this binary has the NCCL communicator.
bool nccl_built();

// How an NCCL communicator learns its place: its rank and the number of ranks, and (more than one
// rank) a collective that hands rank 0's ncclUniqueId to every rank. `abort_world` ends every rank
// of the job (MPI_Abort) when the communicator aborts; without it abort() ends this process only.
// The default is one rank on its own: no other process, no MPI (the GPU check's box has none).
struct NcclBootstrap {
  int rank = 0, size = 1;
  std::function<void(void* id, size_t bytes)> share_id;  // rank 0's bytes to every rank
  void (*abort_world)(int code) = nullptr;
};

// The Communicator on the device of `be` (a CUDA backend): rank 0 creates an ncclUniqueId that
// `how` shares, every rank joins (ncclCommInitRank); split() is ncclCommSplit. Calls are queued on
// the communicator's own stream, which waits (an event) for the work queued on `be`'s stream before
// each call, and `be`'s stream waits for the call's result, so callers see the same ordering as on
// MPI. Host buffers (e.g. a loss on the host) are staged through device memory and waited for.
// Collective over the ranks of `how`. Throws berth::Error when NCCL is not built.
std::unique_ptr<Communicator> make_nccl(Backend& be, const NcclBootstrap& how = {});

// make_nccl over MPI_COMM_WORLD's ranks: the id is broadcast over MPI, and abort() is MPI_Abort.
// Collective over MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_nccl_world(Backend& be);

// MPI for the CPU backend, NCCL for the CUDA backend (an Error naming the reason when this binary
// has no NCCL). Collective over MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_world(Backend& be);

}  // namespace berth
