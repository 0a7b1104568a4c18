// Thread count of the CPU kernels: OpenMP loops and OpenBLAS (its OpenMP build) together.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "kernels/ops.h"

namespace berth::cpu {

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

int affinity_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return online_cores();
  return std::max(1, CPU_COUNT(&set));
}

int online_cores() { return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)); }

std::string oversubscription_warning(int ranks_on_host, int threads, int affinity_cores,
                                     int online_cores) {
  // More ranks than cores (`mpirun --oversubscribe`) is the launcher's choice; fewer threads
  // per rank is what berth can suggest, so one thread a rank is never warned about.
  const int fit = std::max(1, std::min(affinity_cores, online_cores / std::max(1, ranks_on_host)));
  if (threads <= fit) return "";
  const std::string what =
      threads > affinity_cores
          ? fmt::format("each rank runs {} OpenMP threads on the {} core(s) it may use", threads,
                        affinity_cores)
          : fmt::format(
                "{} ranks on this host run {} OpenMP threads each, {} threads on its {} "
                "cores",
                ranks_on_host, threads, int64_t(ranks_on_host) * threads, online_cores);
  return fmt::format(
      "{}: threads that share a core wait for each other at every parallel loop, and steps can "
      "be several times slower. Give each rank {} thread(s) (`mpirun -x OMP_NUM_THREADS={}`), "
      "or bind each rank to its own cores (`mpirun --map-by slot:PE={}`)",
      what, fit, fit, fit);
}

}  // namespace berth::cpu
