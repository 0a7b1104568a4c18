// Thread count of the CPU kernels: OpenMP loops and OpenBLAS (its OpenMP build) together.
#include <cblas.h>
#include <omp.h>

#include "kernels/ops.h"

namespace berth::cpu {

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace berth::cpu
