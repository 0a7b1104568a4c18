// The memory a process may use: its cgroup's limit, read as Slurm, Kubernetes and container
// runtimes lay the hierarchies out (runtime/core/host_memory.h), on fake /proc/self/cgroup files
// and cgroup trees in a temporary directory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/core/host_memory.h"

namespace berth {
namespace {

namespace fs = std::filesystem;

class CgroupLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("berth_cgroup_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "sys");
  }
  void TearDown() override { fs::remove_all(root_); }
  // Writes `text` to sys/<rel>, making its directories.
  void put(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / "sys" / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  double limit(const std::string& proc_self_cgroup) {
    std::ofstream(root_ / "cgroup") << proc_self_cgroup;
    return memory(proc_self_cgroup).limit_bytes;
  }
  CgroupMemory memory(const std::string& proc_self_cgroup) {
    std::ofstream(root_ / "cgroup") << proc_self_cgroup;
    return cgroup_memory((root_ / "cgroup").string(), (root_ / "sys").string());
  }
  fs::path root_;
};

constexpr double kGiB = 1073741824.0;

// Slurm on cgroup v2: the job's group limits (--mem), its step inherits; the root has no file.
TEST_F(CgroupLimit, V2TakesTheJobsGroupAboveTheStep) {
  put("system.slice/slurmstepd.scope/job_42/memory.max", "17179869184\n");
  put("system.slice/slurmstepd.scope/job_42/step_0/memory.max", "max\n");
  put("system.slice/slurmstepd.scope/job_42/step_0/user/task_0/memory.max", "max\n");
  EXPECT_EQ(limit("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"), 16 * kGiB);
}

// The tightest of the group and its ancestors, wherever it is.
TEST_F(CgroupLimit, TheTightestAncestorWins) {
  put("a/memory.max", "1073741824\n");
  put("a/b/memory.max", "4294967296\n");
  EXPECT_EQ(limit("0::/a/b\n"), kGiB);
  put("a/b/memory.max", "536870912\n");
  EXPECT_EQ(limit("0::/a/b\n"), 0.5 * kGiB);
}

// A container with its own cgroup namespace: the path is "/", the limit at the mount point.
TEST_F(CgroupLimit, V2ContainerReadsTheMountPoint) {
  put("memory.max", "8589934592\n");
  EXPECT_EQ(limit("0::/\n"), 8 * kGiB);
}

// cgroup v1 (and hybrid): the memory hierarchy's line, among the other controllers';
// PAGE_COUNTER_MAX (9223372036854771712) is no limit; a container without a namespace sees the
// host's path, which is not under its mount, and the mount point's own file.
TEST_F(CgroupLimit, V1ReadsTheMemoryHierarchy) {
  put("memory/memory.limit_in_bytes", "9223372036854771712\n");
  put("memory/slurm/uid_0/job_7/memory.limit_in_bytes", "34359738368\n");
  put("memory/slurm/uid_0/job_7/step_batch/memory.limit_in_bytes", "9223372036854771712\n");
  const std::string lines =
      "12:cpuset:/slurm/uid_0/job_7/step_batch\n"
      "11:memory:/slurm/uid_0/job_7/step_batch\n"
      "1:name=systemd:/user.slice\n"
      "0::/user.slice\n";
  EXPECT_EQ(limit(lines), 32 * kGiB);
  EXPECT_EQ(limit("4:memory:/docker/0123abcd\n"), 0) << "unlimited at the mount point";
  put("memory/memory.limit_in_bytes", "2147483648\n");
  EXPECT_EQ(limit("4:memory:/docker/0123abcd\n"), 2 * kGiB);
  EXPECT_EQ(limit("5:cpu,memory:/x\n"), 2 * kGiB) << "memory in a list of controllers";
}

// No limit anywhere, no readable file, garbage: 0 (the host's MemTotal applies).
TEST_F(CgroupLimit, NoLimitIsZero) {
  put("memory.max", "max\n");
  EXPECT_EQ(limit("0::/\n"), 0);
  put("memory.max", "lots\n");
  EXPECT_EQ(limit("0::/\n"), 0);
  put("memory.max", "0\n");
  EXPECT_EQ(limit("0::/\n"), 0);
  EXPECT_EQ(limit("0::/not/there\n"), 0);
  EXPECT_EQ(limit("garbage without colons\n"), 0);
  EXPECT_EQ(limit(""), 0);
  EXPECT_EQ(cgroup_memory((root_ / "missing").string(), (root_ / "sys").string()).limit_bytes, 0);
  EXPECT_EQ(memory("0::/\n").headroom_bytes, -1) << "no limit, no headroom";
}

// The headroom: the least of (limit − working set) over the limited groups, the working set being
// the usage less the inactive page cache (v2 inactive_file, v1 total_inactive_file); a group
// whose usage cannot be read gives none; a group over its limit has 0.
TEST_F(CgroupLimit, HeadroomIsTheLimitLessTheWorkingSet) {
  put("job/memory.max", "17179869184\n");  // 16 GiB
  EXPECT_EQ(memory("0::/job/step\n").headroom_bytes, -1) << "usage unreadable";
  put("job/memory.current", "12884901888\n");  // 12 GiB, of which 3 GiB inactive page cache
  put("job/memory.stat", "anon 9663676416\nfile 3221225472\ninactive_file 3221225472\n");
  EXPECT_EQ(memory("0::/job/step\n").headroom_bytes, 7 * kGiB);
  put("memory.max", "8589934592\n");  // the parent: 8 GiB limit, 2 GiB used, more room than the job
  put("memory.current", "2147483648\n");
  EXPECT_EQ(memory("0::/job/step\n").headroom_bytes, 6 * kGiB);
  EXPECT_EQ(memory("0::/job/step\n").limit_bytes, 8 * kGiB);
  put("memory.current", "9663676416\n");  // 9 GiB: over its limit
  EXPECT_EQ(memory("0::/job/step\n").headroom_bytes, 0);
  put("memory/slurm/job_7/memory.limit_in_bytes", "4294967296\n");
  put("memory/slurm/job_7/memory.usage_in_bytes", "3221225472\n");
  put("memory/slurm/job_7/memory.stat", "cache 2147483648\ntotal_inactive_file 1073741824\n");
  EXPECT_EQ(memory("3:memory:/slurm/job_7/step_0\n").headroom_bytes, 2 * kGiB);
}

// This process: the limit and what is available at most MemTotal, both positive on Linux.
TEST(HostMemory, LimitIsPositiveAndAtMostMemTotal) {
  const double total = host_meminfo_bytes("MemTotal"), limit = host_memory_limit_bytes();
  ASSERT_GT(total, 0);
  EXPECT_GT(limit, 0);
  EXPECT_LE(limit, total);
  const double avail = host_memory_available_bytes();
  EXPECT_GT(avail, 0);
  EXPECT_LE(avail, total);
}

}  // namespace
}  // namespace berth
