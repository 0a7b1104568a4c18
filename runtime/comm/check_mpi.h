// MPI_CHECK(expr): the MPI member of the check-macro family (STYLE.md rule 4).
//
// Evaluates `expr` (an MPI call returning an int error code) exactly once; on any code other than
// MPI_SUCCESS throws berth::Error("MPI error: <MPI_Error_string> (code N) in `expr` at file:line
// on rank R/W@host"). MPI only returns error codes on communicators whose error handler is
// MPI_ERRORS_RETURN (the default, MPI_ERRORS_ARE_FATAL, aborts inside the call); MpiCommunicator
// sets it on every communicator it uses.
#pragma once

#include <mpi.h>

#include <string>

#include "runtime/core/check.h"

namespace berth::detail {

// The MPI library's text for an error code, or "unknown MPI error code N".
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS || len <= 0) {
    return fmt::format("unknown MPI error code {}", code);
  }
  return std::string(text, static_cast<size_t>(len));
}

// identity() once main has called set_identity; before that, add the MPI_COMM_WORLD rank if MPI
// is up, so a failure is never anonymous.
inline std::string mpi_identity() {
  if (identity_rank() >= 0) return identity();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return identity();
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return fmt::format("{} (MPI_COMM_WORLD rank {}/{})", identity(), rank, size);
}

[[noreturn]] inline void mpi_fail(int code, const char* expr, const char* file, int line) {
  throw Error(fmt::format("MPI error: {} (code {}) in `{}` at {}:{} on {}", mpi_error_string(code),
                          code, expr, file, line, mpi_identity()));
}

}  // namespace berth::detail

#define MPI_CHECK(expr)                                                    \
  do {                                                                     \
    const int berth_mpi_rc_ = (expr);                                      \
    if (berth_mpi_rc_ != MPI_SUCCESS) {                                    \
      ::berth::detail::mpi_fail(berth_mpi_rc_, #expr, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)
