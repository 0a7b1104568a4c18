// What every Communicator shares, with no MPI or NCCL in it (the GPU check builds only this).
#include "runtime/comm/communicator.h"

#include "runtime/core/check.h"

namespace berth {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  BERTH_FAIL("dtype_size: unknown DType value {}", static_cast<int>(t));
}

}  // namespace berth
