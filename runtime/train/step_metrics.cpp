#include "runtime/train/step_metrics.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "kernels/ops.h"
#include "runtime/core/check.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"

namespace berth {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr size_t kNameBytes = 64;

}  // namespace

double host_rss_gib() {
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / kGiB;
}

double host_peak_rss_gib() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  // ru_maxrss is in KiB on Linux. The kernel updates it lazily (when the mapping changes), so it
  // can trail the resident size read now: the peak is at least that.
  return std::max(static_cast<double>(u.ru_maxrss) * 1024.0 / kGiB, host_rss_gib());
}

double heap_in_use_bytes() {
  const struct mallinfo2 mi = mallinfo2();  // every arena, and the chunks malloc mmap()ed
  return double(mi.uordblks) + double(mi.hblkhd);
}

double host_capacity_gib_per_rank(int ranks_on_host) {
  return host_memory_limit_bytes() / kGiB / static_cast<double>(std::max(1, ranks_on_host));
}

void warn_if_threads_oversubscribed(const LocalRank& local, const std::string& consequence) {
  if (local.rank != 0) return;
  const std::string w = cpu::oversubscription_warning(local.size, cpu::num_threads(),
                                                      cpu::affinity_cores(), cpu::online_cores());
  if (!w.empty()) log_warn("{}; {}", w, consequence);
}

std::vector<std::string> gather_rank_names(Communicator& world) {
  std::vector<char> mine(kNameBytes, '\0');
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kNameBytes - 1));
  std::vector<char> all(kNameBytes * size_t(world.size()));
  world.all_gather(mine.data(), all.data(), std::vector<size_t>(size_t(world.size()), kNameBytes),
                   DType::U8);
  std::vector<std::string> names;
  for (int r = 0; r < world.size(); ++r) {
    names.push_back(fmt::format("{}@{}", r, std::string(all.data() + size_t(r) * kNameBytes)));
  }
  return names;
}

std::vector<RankStepMetrics> gather_step_metrics(Communicator& world,
                                                 const RankStepMetrics& mine) {
  // NCCL has no gather; an all-gather of an 88-byte record is the same cost class at these sizes.
  std::vector<RankStepMetrics> all(size_t(world.size()));
  world.all_gather(&mine, all.data(),
                   std::vector<size_t>(size_t(world.size()), kRankStepMetricsDoubles), DType::F64);
  if (world.rank() != 0) all.clear();
  return all;
}

}  // namespace berth
