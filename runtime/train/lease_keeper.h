// The training lease (docs/reservation.md): rank 0 of `berth train` holds the reservation's lease
// for the whole run. At start it acquires it (the launching user's booking, window open, no other
// live holder, the booked devices are the ranks' hosts and local ranks, each with the booked free
// memory) and broadcasts the fencing token, which every checkpoint commit carries. A heartbeat
// thread on rank 0 renews it every TTL/3 on its own ledger connection, so a checkpoint save or an
// evaluation longer than the TTL keeps it. Before every step rank 0 decides, for all ranks:
// continue; stop at the end of the window (checkpoint, exit "window ended, resumable"); or stop
// because the lease is lost (a renewal refused, or none succeeded for a TTL). A window that ends
// before the run stopped (a pause longer than the stop margin) still stops with a checkpoint:
// after its window, nobody can take a reservation's lease.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

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

// Acquires the lease of `reservation` for this process on `host` (rank 0 of `berth train`).
// Leases of this host whose process is gone (killed: a zombie, no such pid, or this process's own
// pid reused) that stand in the way are waited for until they lapse, up to `most_wait_s` in all;
// a live holder of this host gets 5 s to end first; a holder on another host, or one that renews
// past the expiry waited for, is refused. A stop signal during a wait throws LeaseRefused.
LeaseResult take_lease(LedgerStore& ledger, int64_t reservation, const std::string& host,
                       double ttl_s, double most_wait_s);

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
  double window_end() const;  // rank 0: as of the last renewal
  // Rank 0: a preemption cut the window short (it cannot be extended any more).
  bool preempted() const;

  // Collective, before each step. `step_s`: how long the next training step may take (the lease
  // must outlast it; the heartbeat renews during it); `with_pauses_s`: that with the evaluation
  // and checkpoint save that may follow it (the window must hold it).
  Decision before_step(double step_s, double with_pauses_s);
  void checkpoint_took(double seconds) { ckpt_s_ = std::max(ckpt_s_, seconds); }
  // How long before the window's end the run stops (1.5 × the longest checkpoint save seen, or
  // reservation.checkpoint_estimate_s before one, + stop_margin_s): its steps must end by then.
  double stop_reserve() const { return stop_reserve_s(cfg_.reservation, checkpoint_s()); }
  // The longest checkpoint save seen, or reservation.checkpoint_estimate_s before one.
  double checkpoint_s() const {
    return ckpt_s_ > 0 ? ckpt_s_ : cfg_.reservation.checkpoint_estimate_s;
  }
  // Collective, after the last step and before the run commits its files: kContinue while the
  // lease is still this run's (one renewal on rank 0), kLost (with reason()) when it is gone.
  Decision confirm_held();
  const std::string& reason() const { return reason_; }  // of the last stop decision
  // Rank 0: the lease ended with its window (not taken, cancelled or lapsed), so the run still
  // ends under it; the run directory is its own unless a later booking's launch claimed it.
  bool window_over() const;
  // Rank 0; idempotent (an on-demand booking is cancelled too). Gives nothing back once the
  // lease is lost: it is another holder's, or nobody's.
  void release();

 private:
  void start_heartbeat(const std::string& path);
  void heartbeat_loop();
  void stop_heartbeat();
  void record_renewal(const Lease& lease);  // a successful renewal; mu_ held
  void note_window_over(const Lease& lease);  // a renewal refused as window_over; mu_ held
  // One renewal on the calling thread (rank 0), recorded when it succeeds; `failed` gets the
  // ledger's error (the result is then not ok and has no reason).
  LeaseResult renew_here(std::string* failed);
  // Rank 0, mu_ not held: the lease ended with its window before the run stopped (window_over):
  // kStopWindow, with a warning and reason_ saying the checkpoint is saved after the end.
  int32_t window_overrun(double now);
  // Collective: rank 0's decision `d` to every rank (a lost lease: the heartbeat stops, nothing
  // is given back), with a reason on the ranks that did not decide.
  Decision share(int32_t d);

  const RunConfig& cfg_;
  Communicator& world_;
  std::unique_ptr<LedgerStore> ledger_;  // rank 0, this thread
  int64_t reservation_ = 0, token_ = 0;
  double ckpt_s_ = 0;
  bool released_ = false, on_demand_ = false, ttl_warned_ = false;
  std::string reason_;

  // The heartbeat (rank 0): its own connection, and what it learned, under mu_.
  std::unique_ptr<LedgerStore> heartbeat_ledger_;
  std::thread heartbeat_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  // window_over_: lost_ only because the window ended (LeaseResult::window_over), not taken.
  bool stop_ = false, lost_ = false, window_over_ = false;
  double window_end_ = 0, local_expiry_ = 0, last_renew_ = 0;
  bool preempted_ = false;  // mu_
  std::string lost_reason_, window_note_;
};

}  // namespace berth
