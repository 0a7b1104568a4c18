#include "runtime/train/stop_signals.h"

#include <atomic>
#include <csignal>

#include "runtime/core/check.h"

namespace berth {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
std::atomic<int> g_received{0};
struct sigaction g_previous[3];
bool g_installed[3] = {false, false, false};
struct sigaction g_previous_pipe;
int g_depth = 0;  // StopSignals alive (only the outermost installs)

// Async-signal-safe: an atomic store, or on a second Ctrl-C the default action. SIGTERM and
// SIGUSR1 come more than once on their own (Slurm signals every task and the launcher, which
// forwards it again), so their repeats are ignored: they must not kill the checkpoint they asked
// for.
void on_signal(int signum) {
  int none = 0;
  if (!g_received.compare_exchange_strong(none, signum) && signum == SIGINT &&
      g_received.load() == SIGINT) {
    std::signal(signum, SIG_DFL);
    std::raise(signum);
  }
}

}  // namespace

StopSignals::StopSignals() {
  if (g_depth > 0) {
    ++g_depth;
    return;
  }
  g_received.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write the signal lands in goes on
  for (int i = 0; i < 3; ++i) {
    BERTH_CHECK(sigaction(kSignals[i], nullptr, &g_previous[i]) == 0,
                "cannot read the handler of {}", name(kSignals[i]));
    // An ignored signal stays ignored (a script's `berth train &` ignores SIGINT, `nohup`-style
    // wrappers others): the user chose that it should not stop the run.
    g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
    if (g_installed[i]) {
      BERTH_CHECK(sigaction(kSignals[i], &sa, nullptr) == 0, "cannot install the handler of {}",
                  name(kSignals[i]));
    }
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  BERTH_CHECK(sigaction(SIGPIPE, &ignore, &g_previous_pipe) == 0, "cannot ignore SIGPIPE");
  g_depth = 1;
}

StopSignals::~StopSignals() {
  if (--g_depth > 0) return;
  sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  for (int i = 0; i < 3; ++i) {
    if (g_installed[i]) sigaction(kSignals[i], &g_previous[i], nullptr);
    g_installed[i] = false;
  }
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
