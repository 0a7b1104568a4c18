// The communicator factory over MPI_COMM_WORLD: MPI for the CPU backend, NCCL bootstrapped over MPI
// for the CUDA backend.
#include <mpi.h>

#include "runtime/comm/check_mpi.h"
#include "runtime/comm/nccl.h"
#include "runtime/core/check.h"

namespace berth {

std::unique_ptr<Communicator> make_nccl_world(Backend& be) {
  NcclBootstrap how;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &how.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &how.size));
  how.share_id = [](void* id, size_t bytes) {
    MPI_CHECK(MPI_Bcast(id, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD));
  };
  how.abort_world = [](int code) { MPI_Abort(MPI_COMM_WORLD, code); };
  return make_nccl(be, how);
}

std::unique_ptr<Communicator> make_world(Backend& be) {
  if (be.kind() == DeviceKind::kCuda) return make_nccl_world(be);
  return make_mpi_world();
}

}  // namespace berth
