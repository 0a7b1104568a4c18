// Other processes of this host.
#pragma once

#include <cstdint>
#include <string>

namespace berth {

// Whether a process `pid` exists on this host (in this PID namespace), whoever owns it: false
// only when the kernel says there is none (ESRCH). A pid reused by another process reads as
// running: callers that free what a dead process held stay on the safe side.
// A zombie (killed, not yet reaped) is not running.
bool process_running(int64_t pid);

// The state letter of a /proc/PID/stat line ('R', 'S', 'Z', ...), '\0' when it is not one.
char process_state(const std::string& proc_stat);

}  // namespace berth
