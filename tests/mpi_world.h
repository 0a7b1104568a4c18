// The world communicator for tests linked with tests/mpi_test_main.cpp (MPI is initialized by
// main before any test runs). Made on first use, shared by every test of the binary.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "runtime/comm/communicator.h"

namespace berth::test {

inline Communicator& world() {
  static std::unique_ptr<Communicator> w = make_mpi_world();
  return *w;
}

// A directory every rank of the world names the same (rank 0's pid in its name) under
// `parent`; rank 0 creates it. Collective. Each test binary passes ::testing::TempDir().
inline std::filesystem::path shared_temp_dir(const std::string& parent, const std::string& prefix) {
  int64_t pid = world().rank() == 0 ? int64_t(::getpid()) : 0;
  world().broadcast(&pid, 1, DType::I64, 0);
  const std::filesystem::path dir = std::filesystem::path(parent) / (prefix + std::to_string(pid));
  if (world().rank() == 0) std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace berth::test
