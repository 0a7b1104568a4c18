#include "runtime/core/process.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

namespace berth {

char process_state(const std::string& proc_stat) {
  // "PID (COMM) S ...": COMM may hold spaces and parentheses, so the state follows the last ')'
  const size_t close = proc_stat.rfind(')');
  if (close == std::string::npos || close + 2 >= proc_stat.size() || proc_stat[close + 1] != ' ')
    return '\0';
  return proc_stat[close + 2];
}

bool process_running(int64_t pid) {
  if (pid <= 0) return false;
  // (beyond pid_t's range a pid cast would turn negative and ask about a process group)
  if (pid > std::numeric_limits<pid_t>::max()) return true;
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;  // EPERM: another user's
  // Killed but not yet reaped (a zombie: its parent, or an init that does not reap, has not
  // waited for it), or being torn down: it runs no more and will not renew anything.
  // (The whole file: a name may hold a newline. A process whose main thread ended while others
  // run reads as a zombie too; berth's do not do that.)
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const char state = process_state(stat);
  return state != 'Z' && state != 'X' && state != 'x';
}

}  // namespace berth
