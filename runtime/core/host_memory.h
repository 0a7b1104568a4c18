// How much memory this process may use on its host: the host's MemTotal, or less where a control
// group limits it, as Slurm (`--mem`, `--mem-per-cpu` under cgroup v1 or v2), Kubernetes and
// container runtimes do. Used for the memory warning's capacity, the pre-flight host-memory
// refusal, and the bound on what a dataset or model file may ask to allocate. And how much it
// could still allocate (MemAvailable, or the cgroup's headroom): a CPU slot's free memory when
// its lease is taken.
#pragma once

#include <string>

namespace berth {

// A /proc/meminfo field in bytes ("MemTotal", "MemAvailable"); 0 when it cannot be read.
double host_meminfo_bytes(const std::string& field);

// This process's control groups' memory: every line of the cgroup file counts: cgroup v2
// ("0::PATH", memory.max, "max" meaning none) and the v1 memory hierarchy ("N:...memory...:PATH",
// memory/…/memory.limit_in_bytes, values of 2^60 bytes and more meaning none). A group's ancestors
// limit it too, so the directory of PATH and each one above it, up to the mount point, are read: on
// a node the job's own group (Slurm's job_N/step_M), in a container with its own cgroup namespace
// the mount point itself. `proc_self_cgroup` is /proc/self/cgroup's path and `cgroup_root` where
// the hierarchies are mounted (/sys/fs/cgroup; parameters for the tests).
struct CgroupMemory {
  double limit_bytes = 0;      // the tightest limit; 0 when none is set (or none can be read)
  double headroom_bytes = -1;  // the least (limit − working set) of the limited groups, where the
                               // usage (memory.current, memory.usage_in_bytes) could be read;
                               // the working set leaves out inactive page cache (memory.stat);
                               // −1 when none
};
CgroupMemory cgroup_memory(const std::string& proc_self_cgroup = "/proc/self/cgroup",
                           const std::string& cgroup_root = "/sys/fs/cgroup");

// min(MemTotal, the cgroup limit), of those known; 0 when neither is.
double host_memory_limit_bytes();

// What this process could still allocate: MemAvailable, or less where a cgroup's headroom is less
// (a Slurm job's --mem on a node with memory to spare). Used for a CPU slot's free memory.
double host_memory_available_bytes();

}  // namespace berth
