// The communicator watchdog: a collective or point-to-point call that has not completed within a
// timeout (a peer hangs, died without an error, or never reached the call) ends the process with a
// message naming the call and how long it waited, instead of holding the job's GPUs until the
// reservation runs out. Under mpirun the launcher then ends the other ranks. Like PyTorch's NCCL
// watchdog (`timeout` of init_process_group) or Megatron's --distributed-timeout-minutes.
//
// Both communicators report their calls to the process's watchdog, when one is installed:
//   - MPI (blocking): the call is open from entry to return (WatchedCall);
//   - NCCL (stream-ordered): the call is open until an event recorded after it on the
//     communicator's stream has completed (a `done` probe the watchdog polls).
// The watchdog's own thread checks the oldest open call every poll interval. The timeout covers
// waits in the call (on NCCL from the moment it was queued, so the compute queued before it
// counts too), so it must exceed the longest time one rank can spend between two collectives
// while the others wait (a checkpoint save, an evaluation, a slow step).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace berth {

class CallWatchdog {
 public:
  using Clock = std::function<double()>;                 // seconds, monotonic
  using Fire = std::function<void(const std::string&)>;  // what to do with the message
  using Done = std::function<bool()>;                    // true once the call has completed
  using Failed = std::function<std::string()>;           // why the call failed, or "" (not yet)

  // A watchdog that calls `fire` with a message when a call stays open longer than timeout_s
  // (> 0). `clock` defaults to std::chrono::steady_clock. No thread until start().
  CallWatchdog(double timeout_s, Fire fire, Clock clock = {});
  ~CallWatchdog();  // stops the thread
  CallWatchdog(const CallWatchdog&) = delete;
  CallWatchdog& operator=(const CallWatchdog&) = delete;

  // Opens a call: `op` (a string literal: "all_reduce", …), its payload bytes and its group's
  // size. With a `done` probe the call closes when the probe returns true (polled by check());
  // without one, when close(token) is called. A `failed` probe, polled while the call is not
  // done, reports an error the library saw in the background (NCCL's asynchronous errors: a
  // peer or the network failed): the watchdog fires at once, without waiting for the timeout.
  uint64_t open(const char* op, size_t bytes, int group_size, Done done = {}, Failed failed = {});
  void close(uint64_t token);

  // One check: closes the calls whose probe says done; when an open call's `failed` probe gives
  // a reason, or the oldest open call has been open longer than the timeout, fires (once per
  // call) and returns true.
  bool check();
  // A thread that runs check() every poll_s seconds until destruction.
  void start(double poll_s);

  double timeout_s() const { return timeout_s_; }
  size_t open_calls() const;

 private:
  struct Call {
    uint64_t token;
    const char* op;
    size_t bytes;
    int group_size;
    double t0;
    Done done;
    Failed failed;
    bool closed = false, fired = false;
  };
  double timeout_s_;
  Fire fire_;
  Clock clock_;
  mutable std::mutex mu_;
  std::deque<Call> calls_;  // in opening order
  uint64_t next_ = 1;
  std::thread thread_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// The process's watchdog (null when none): communicators report to it. install_comm_watchdog
// replaces it (null removes it); not to be called while a communicator call is running.
CallWatchdog* comm_watchdog();
void install_comm_watchdog(std::unique_ptr<CallWatchdog> w);

// Installs a watchdog with the runtime's action and starts its thread (a poll every
// min(1 s, timeout/10)): the message goes to the log with rank@host, then the process exits with
// `exit_code` without waiting for anything (a hung call cannot be unwound). timeout_s <= 0
// removes the watchdog.
void install_comm_watchdog(double timeout_s, int exit_code);

// Scope of a blocking call, reported to the installed watchdog (nothing when there is none).
class WatchedCall {
 public:
  WatchedCall(const char* op, size_t bytes, int group_size);
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  CallWatchdog* w_;
  uint64_t token_ = 0;
};

}  // namespace berth
