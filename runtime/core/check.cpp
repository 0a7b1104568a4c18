#include "runtime/core/check.h"

#include <unistd.h>

namespace berth {

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

namespace {

struct Identity {
  int rank = -1;
  std::string text = "rank ?@" + host_name();
};

Identity& the_identity() {
  static Identity id;
  return id;
}

}  // namespace

const std::string& identity() { return the_identity().text; }

int identity_rank() { return the_identity().rank; }

void set_identity(int rank, int world_size) {
  Identity& id = the_identity();
  id.rank = rank;
  id.text = fmt::format("rank {}/{}@{}", rank, world_size, host_name());
}

}  // namespace berth
