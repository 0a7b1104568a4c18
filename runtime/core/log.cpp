#include "runtime/core/log.h"

#include <cstdio>

#include "runtime/core/check.h"

namespace berth {

void log_line(const char* level, bool all_ranks, const std::string& message) {
  const int rank = identity_rank();
  if (!all_ranks) {
    if (rank > 0) return;
    std::fprintf(stdout, "%s\n", message.c_str());
    std::fflush(stdout);
    return;
  }
  std::fprintf(stderr, "berth %s [%s]: %s\n", level, identity().c_str(), message.c_str());
  std::fflush(stderr);
}

}  // namespace berth
