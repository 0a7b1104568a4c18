// Other processes of this host.
#pragma once

#include <cstdint>

namespace berth {

// Whether a process `pid` exists on this host (in this PID namespace), whoever owns it: false
// only when the kernel says there is none (ESRCH). A pid reused by another process reads as
// running: callers that free what a dead process held stay on the safe side.
bool process_running(int64_t pid);

}  // namespace berth
