// The communicator factory: the one place in runtime/comm outside nccl.cpp that knows whether NCCL
// was built.
#include "runtime/comm/nccl.h"
#include "runtime/core/check.h"

namespace berth {

bool nccl_built() { return BERTH_NCCL != 0; }

#if !BERTH_NCCL
std::unique_ptr<Communicator> make_nccl_world(Backend&) {
  BERTH_FAIL(
      "this berth has no NCCL communicator (built without CUDA, or NCCL was not found: install "
      "it with the CUDA toolkit, or point NCCL_ROOT at it, and rebuild)");
}
#endif

std::unique_ptr<Communicator> make_world(Backend& be) {
  if (be.kind() == DeviceKind::kCuda) return make_nccl_world(be);
  return make_mpi_world();
}

}  // namespace berth
