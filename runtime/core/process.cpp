#include "runtime/core/process.h"

#include <signal.h>

#include <cerrno>

namespace berth {

bool process_running(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH;  // EPERM: another user's
}

}  // namespace berth
