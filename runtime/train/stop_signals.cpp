#include "runtime/train/stop_signals.h"

#include <atomic>
#include <csignal>

#include "runtime/core/check.h"

namespace berth {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
std::atomic<int> g_received{0};
struct sigaction g_previous[3];

// Async-signal-safe: an atomic store, or on the second signal the default action.
void on_signal(int signum) {
  int none = 0;
  if (!g_received.compare_exchange_strong(none, signum) && g_received.load() == signum) {
    std::signal(signum, SIG_DFL);
    std::raise(signum);
  }
}

}  // namespace

StopSignals::StopSignals() {
  g_received.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write the signal lands in goes on
  for (int i = 0; i < 3; ++i) {
    BERTH_CHECK(sigaction(kSignals[i], &sa, &g_previous[i]) == 0,
                "cannot install the handler of {}", name(kSignals[i]));
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
  g_received.store(0);
}

int StopSignals::received() { return g_received.load(); }

const char* StopSignals::name(int signum) {
  switch (signum) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace berth
