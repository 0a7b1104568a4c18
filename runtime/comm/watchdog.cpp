#include "runtime/comm/watchdog.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/log.h"

namespace berth {

CallWatchdog::CallWatchdog(double timeout_s, Fire fire, Clock clock)
    : timeout_s_(timeout_s), fire_(std::move(fire)), clock_(std::move(clock)) {
  BERTH_CHECK(timeout_s_ > 0, "the communicator watchdog needs a timeout > 0 s, got {}",
              timeout_s_);
  if (!clock_) {
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
}

CallWatchdog::~CallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t CallWatchdog::open(const char* op, size_t bytes, int group_size, Done done,
                            Failed failed) {
  const double now = clock_();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t token = next_++;
  calls_.push_back(Call{token, op, bytes, group_size, now, std::move(done), std::move(failed)});
  return token;
}

namespace {

std::string describe_call(const char* op, size_t bytes, int group_size) {
  return fmt::format("{} of {} in a group of {} rank(s)", op,
                     bytes < (1u << 20) ? fmt::format("{} bytes", bytes)
                                        : fmt::format("{:.1f} MiB", double(bytes) / (1 << 20)),
                     group_size);
}

}  // namespace

void CallWatchdog::close(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  // blocking calls close in the order they opened, so this is nearly always the back
  for (auto it = calls_.rbegin(); it != calls_.rend(); ++it) {
    if (it->token == token) {
      it->closed = true;
      break;
    }
  }
  while (!calls_.empty() && calls_.front().closed) calls_.pop_front();
}

bool CallWatchdog::check() {
  // The probes run without the lock (a device query may be slow, and the calling thread must
  // still be able to open and close calls); entries popped here are destroyed after it is
  // released too (a probe's event goes with them).
  struct Probe {
    uint64_t token;
    Done done;
    Failed failed;
  };
  std::vector<Probe> probes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Call& c : calls_)
      if (!c.closed && !c.fired && (c.done || c.failed))
        probes.push_back(Probe{c.token, c.done, c.failed});
  }
  std::vector<uint64_t> finished;
  uint64_t failed_token = 0;
  std::string reason;
  for (const Probe& p : probes) {
    if (p.done && p.done()) {
      finished.push_back(p.token);
    } else if (p.failed && failed_token == 0) {
      reason = p.failed();
      if (!reason.empty()) failed_token = p.token;
    }
  }
  probes.clear();
  std::deque<Call> popped;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Call& c : calls_)
      if (std::find(finished.begin(), finished.end(), c.token) != finished.end()) c.closed = true;
    while (!calls_.empty() && calls_.front().closed) {
      popped.push_back(std::move(calls_.front()));
      calls_.pop_front();
    }
    if (calls_.empty()) return false;
    const double now = clock_();
    for (Call& c : calls_) {
      if (c.token != failed_token || c.closed || c.fired) continue;
      c.fired = true;
      message = fmt::format(
          "communicator error: {} failed after {:.1f} s: {}; ending the job (the other ranks' "
          "logs, or the node's, say which peer or link failed)",
          describe_call(c.op, c.bytes, c.group_size), now - c.t0, reason);
    }
    if (message.empty()) {
      Call* oldest = &calls_.front();  // open: the closed ones at the front were popped
      const double waited = now - oldest->t0;
      if (oldest->fired || waited <= timeout_s_) return false;
      oldest->fired = true;
      message = fmt::format(
          "communicator timeout: {} has not completed after {:.1f} s (limit {:g} s): a peer "
          "hangs, died, or never reached this call; ending the job. If the wait is legitimate (a "
          "long checkpoint save or evaluation), raise parallel.comm_timeout_s",
          describe_call(oldest->op, oldest->bytes, oldest->group_size), waited, timeout_s_);
    }
  }
  fire_(message);
  return true;
}

void CallWatchdog::start(double poll_s) {
  BERTH_CHECK(!thread_.joinable(), "the communicator watchdog's thread is already running");
  thread_ = std::thread([this, poll_s] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::duration<double>(poll_s));
      if (stop_) break;
      lock.unlock();
      check();
      lock.lock();
    }
  });
}

size_t CallWatchdog::open_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Call& c : calls_) n += !c.closed;
  return n;
}

namespace {
std::atomic<CallWatchdog*> g_watchdog{nullptr};
std::unique_ptr<CallWatchdog> g_owned;
}  // namespace

CallWatchdog* comm_watchdog() { return g_watchdog.load(std::memory_order_acquire); }

void install_comm_watchdog(std::unique_ptr<CallWatchdog> w) {
  g_watchdog.store(w.get(), std::memory_order_release);
  g_owned = std::move(w);  // the previous one (if any) stops its thread here
}

void install_comm_watchdog(double timeout_s, int exit_code) {
  if (timeout_s <= 0) {
    install_comm_watchdog(nullptr);
    return;
  }
  auto w = std::make_unique<CallWatchdog>(timeout_s, [exit_code](const std::string& message) {
    log_error("{}", message);
    std::fflush(nullptr);
    // A failed call (NCCL's asynchronous error) is most often a peer that failed on its own and
    // aborted its communicators while unwinding: give it the time to print why (its report
    // waits 0.5 s for rank 0's, launcher/main.cpp) before this exit makes the launcher end it.
    if (message.rfind("communicator error", 0) == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    std::_Exit(exit_code);  // the hung call cannot be unwound; mpirun ends the other ranks
  });
  w->start(std::min(1.0, timeout_s / 10));
  install_comm_watchdog(std::move(w));
}

WatchedCall::WatchedCall(const char* op, size_t bytes, int group_size) : w_(comm_watchdog()) {
  if (w_ != nullptr) token_ = w_->open(op, bytes, group_size);
}

WatchedCall::~WatchedCall() {
  if (w_ != nullptr) w_->close(token_);
}

}  // namespace berth
