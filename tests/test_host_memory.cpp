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
    return cgroup_memory_limit_bytes((root_ / "cgroup").string(), (root_ / "sys").string());
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
  EXPECT_EQ(cgroup_memory_limit_bytes((root_ / "missing").string(), (root_ / "sys").string()), 0);
}

// This process: at most MemTotal, and positive on Linux.
TEST(HostMemory, LimitIsPositiveAndAtMostMemTotal) {
  const double total = host_meminfo_bytes("MemTotal"), limit = host_memory_limit_bytes();
  ASSERT_GT(total, 0);
  EXPECT_GT(limit, 0);
  EXPECT_LE(limit, total);
}

}  // namespace
}  // namespace berth
