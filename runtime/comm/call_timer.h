// Wall time of a communicator call, added to CommStats::seconds (both communicators use it).
#pragma once

#include <chrono>

namespace berth {

// Adds the wall time of its scope to *total.
struct CallTimer {
  explicit CallTimer(double* total) : total(total), t0(std::chrono::steady_clock::now()) {}
  ~CallTimer() {
    *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;
  double* total;
  std::chrono::steady_clock::time_point t0;
};

}  // namespace berth
