#include "runtime/core/process.h"

#include <signal.h>

#include <cerrno>
#include <limits>

namespace berth {

bool process_running(int64_t pid) {
  if (pid <= 0) return false;
  // (beyond pid_t's range a pid cast would turn negative and ask about a process group)
  if (pid > std::numeric_limits<pid_t>::max()) return true;
  return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH;  // EPERM: another user's
}

}  // namespace berth
