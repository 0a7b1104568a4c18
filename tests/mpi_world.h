// The world communicator for tests linked with tests/mpi_test_main.cpp (MPI is initialized by
// main before any test runs). Made on first use, shared by every test of the binary.
#pragma once

#include <memory>

#include "runtime/comm/communicator.h"

namespace berth::test {

inline Communicator& world() {
  static std::unique_ptr<Communicator> w = make_mpi_world();
  return *w;
}

}  // namespace berth::test
