// main() for GoogleTest binaries that need MPI (run as a singleton or under mpirun -np N).
// Every rank runs every test; only rank 0 prints gtest's report, the other ranks print their own
// failures with rank@host. All ranks exit with the same status (1 if any rank failed), so mpirun
// fails when one rank did; rank 0 names the ranks that failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/check.h"

namespace {

// On ranks other than 0 (whose default printer is removed), prints each failure with the rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(std::string who) : who_(std::move(who)) {}
  // The name is kept here: UnitTest::current_test_info() inside OnTestPartResult would take the
  // mutex gtest already holds while reporting, and deadlock.
  void OnTestStart(const testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[%s] FAILURE in %s at %s:%d\n%s\n", who_.c_str(), test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
    std::fflush(stderr);
  }
  void OnTestEnd(const testing::TestInfo& t) override {
    if (t.result()->Failed()) std::fprintf(stderr, "[%s] FAILED %s\n", who_.c_str(), test_.c_str());
    std::fflush(stderr);
  }

 private:
  std::string who_, test_ = "(no test)";
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  berth::set_identity(rank, size);
  testing::InitGoogleTest(&argc, argv);
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(berth::identity()));
  }
  int failed = 1;
  try {
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[%s] %s\n", berth::identity().c_str(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::vector<int> per_rank(size_t(size), 0);
  MPI_Gather(&failed, 1, MPI_INT, per_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any) {
    std::string ranks;
    for (int q = 0; q < size; ++q) {
      if (per_rank[size_t(q)]) ranks += fmt::format(" {}", q);  // (GCC 12 -Wrestrict bug on "+")
    }
    std::fprintf(stderr, "%s: FAILED on rank(s)%s of %d\n", argv[0], ranks.c_str(), size);
  }
  MPI_Finalize();
  return any ? 1 : 0;
}
