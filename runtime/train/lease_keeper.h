// The training lease (docs/reservation.md): rank 0 of `berth train` holds the reservation's lease
// for the whole run. At start it acquires it (window open, no other live holder, the booked
// devices are the ranks' hosts and local ranks, each with the booked free memory) and broadcasts
// the fencing token, which every checkpoint commit carries. Before every step rank 0 renews on
// schedule (every TTL/3) and decides, for all ranks: continue; stop at the end of the window
// (checkpoint, exit "window ended, resumable"); or stop because the lease is lost.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/cluster/ledger.h"
#include "runtime/comm/communicator.h"
#include "runtime/config/config.h"
#include "runtime/core/check.h"

namespace berth {

// The lease could not be acquired (thrown on every rank together).
struct LeaseRefused : Error {
  using Error::Error;
};

// Ledger options for the ledger at `path`: the policy from <path>.policy.toml when it exists.
LedgerOptions ledger_options_for(const std::string& path);

class LeaseKeeper {
 public:
  enum Decision : int32_t { kContinue = 0, kStopWindow = 1, kLost = 2 };

  // Collective. Inactive when reservation.id is 0 and reservation.without is "none". Throws
  // LeaseRefused (all ranks) when the lease cannot be had, Error on a bad ledger.
  LeaseKeeper(const RunConfig& cfg, Communicator& world);
  ~LeaseKeeper();

  bool active() const { return token_ > 0; }
  std::optional<int64_t> token() const;
  int64_t reservation() const { return reservation_; }
  double window_end() const { return window_end_; }

  // Collective, before each step. `step_s`: how long the next step may take.
  Decision before_step(double step_s);
  void checkpoint_took(double seconds) { ckpt_s_ = std::max(ckpt_s_, seconds); }
  const std::string& reason() const { return reason_; }  // of the last stop decision
  void release();  // rank 0; idempotent (an on-demand booking is cancelled too)

 private:
  const RunConfig& cfg_;
  Communicator& world_;
  std::unique_ptr<LedgerStore> ledger_;  // rank 0
  int64_t reservation_ = 0, token_ = 0;
  double window_end_ = 0, local_expiry_ = 0, last_renew_ = 0, ckpt_s_ = 0;
  bool released_ = false, on_demand_ = false;
  std::string reason_;
};

}  // namespace berth
