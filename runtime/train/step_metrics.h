// Per-rank step measurements (docs/progress.md): host memory probes, and gathering every rank's
// fixed-size RankStepMetrics record to rank 0.
#pragma once

#include <string>
#include <vector>

#include "runtime/cluster/progress_monitor.h"
#include "runtime/comm/communicator.h"

namespace berth {

// Host memory of this process: resident set now, and its high-water mark (getrusage), in GiB.
double host_rss_gib();
double host_peak_rss_gib();
// Bytes this process holds from malloc/new now (glibc mallinfo2: in-use chunks of every arena
// plus large mmap()ed ones): what berth allocates, without the binary, libraries and stacks.
double heap_in_use_bytes();
// Memory a rank may use on this host: host_memory_limit_bytes() (MemTotal, or the tighter limit of
// the process's cgroup) divided by the ranks on this host.
double host_capacity_gib_per_rank(int ranks_on_host);

// On the host's local rank 0: logs kernels/ops.h's oversubscription_warning for this host's
// ranks and this process's OpenMP threads, if any, followed by "; " + `consequence`.
void warn_if_threads_oversubscribed(const LocalRank& local, const std::string& consequence);

// "rank@host" of every rank of `world`, in rank order (collective).
std::vector<std::string> gather_rank_names(Communicator& world);

// Every rank's record, on rank 0 (index = rank); other ranks get an empty vector. Collective.
std::vector<RankStepMetrics> gather_step_metrics(Communicator& world, const RankStepMetrics& mine);

}  // namespace berth
