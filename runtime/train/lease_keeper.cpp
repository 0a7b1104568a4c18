#include "runtime/train/lease_keeper.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/config/cluster_files.h"
#include "runtime/core/clock.h"
#include "runtime/core/host_memory.h"
#include "runtime/core/log.h"
#include "runtime/core/process.h"
#include "runtime/train/step_metrics.h"
#include "runtime/train/stop_signals.h"

namespace berth {
namespace {

constexpr size_t kHostBytes = 256;

// What one rank tells rank 0: its host, local rank and the memory free for it.
struct RankPlace {
  char host[kHostBytes] = {};
  double local_rank = 0;
  double free_bytes = 0;
};

// The booked devices must be the ranks' hosts: local rank k of a host uses the k-th booked device
// of that host (by index), which must exist, and, a CPU slot, have the free memory (a GPU's free
// memory is not checked: the host's says nothing about it). Throws LeaseRefused.
void check_placement(const Reservation& r, const std::vector<RankPlace>& places) {
  for (size_t k = 0; k < places.size(); ++k) {
    const RankPlace& p = places[k];
    const int64_t local_rank = int64_t(p.local_rank);
    std::vector<const Device*> on_host;
    for (const Device& d : r.devices)
      if (d.host == p.host) on_host.push_back(&d);
    std::sort(on_host.begin(), on_host.end(),
              [](const Device* a, const Device* b) { return a->index < b->index; });
    if (local_rank >= int64_t(on_host.size())) {
      std::string booked;
      for (const Device& d : r.devices) booked += (booked.empty() ? "" : ", ") + device_name(d);
      throw LeaseRefused(fmt::format(
          "rank {} runs on {} as local rank {}, but reservation {} booked {} device(s) on {} "
          "(it booked {}): launch on the booked hosts, one rank per booked device",
          k, p.host, local_rank, r.id, on_host.size(), p.host, booked));
    }
    if (on_host[size_t(local_rank)]->kind == "cpu" && p.free_bytes < double(r.min_free_mem_bytes)) {
      throw LeaseRefused(fmt::format(
          "rank {} on {} has {:.1f} GiB free, reservation {} needs {:.1f} GiB per device", k,
          p.host, p.free_bytes / (1 << 30), r.id, double(r.min_free_mem_bytes) / (1 << 30)));
    }
  }
}

// Sleeps `seconds` in slices; false when a stop signal came first (scancel during a wait).
bool sleep_unless_stopped(double seconds) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, seconds));
  while (std::chrono::steady_clock::now() < until && StopSignals::received() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return StopSignals::received() == 0;
}

[[noreturn]] void refuse_on_signal(int64_t reservation) {
  throw LeaseRefused(
      fmt::format("{} received while waiting for the lease of reservation {}: "
                  "not taken",
                  StopSignals::name(StopSignals::received()), reservation));
}

}  // namespace

// Acquires the lease of `reservation` for this process. A holder of this host whose process is
// gone (the OOM killer, SIGKILL: it could not give the lease back) holds it only until its TTL
// runs out: a relaunch (a requeued job) waits for that and takes it, instead of failing, for as
// many such leases as stand in the way (its own booking's, another booking's job still on one of
// its devices) within `most_wait_s` in all. Gone: no such process here, a zombie, or this
// process's own pid (it holds nothing yet: a dead predecessor's pid reused, a container's
// requeue). A holder of this host still alive gets a few seconds to end (a rank orphaned when
// its mpirun was killed runs on for a moment); one that lives on, or one on another host, is
// refused (a second launch); one that merely shares the host name from another PID namespace
// renews while this waits, so the retry is refused as before.
LeaseResult take_lease(LedgerStore& ledger, int64_t reservation, const std::string& host,
                       double ttl_s, double most_wait_s) {
  constexpr double kGraceS = 5;
  const double give_up = unix_now() + most_wait_s;
  std::vector<std::pair<int64_t, int64_t>> waited;  // (reservation, pid) of the leases waited for
  for (bool graced = false;;) {
    LeaseResult l = ledger.acquire_lease(reservation, current_user(), host, getpid(), ttl_s);
    if (l.ok || !l.held_by || l.held_by->host != host) return l;
    const Lease held = *l.held_by;
    // Still there after its expiry: it renewed, so it lives (in another PID namespace under the
    // same host name): a second launch after all.
    if (std::find(waited.begin(), waited.end(), std::make_pair(held.reservation, held.pid)) !=
        waited.end()) {
      l.reason += fmt::format(
          " (pid {} renewed after its lease's expiry, so it runs, though not where this process "
          "can see it: another PID namespace under the same host name)",
          held.pid);
      return l;
    }
    auto gone = [&] { return held.pid == getpid() || !process_running(held.pid); };
    if (!gone()) {
      if (graced) return l;
      graced = true;
      const double until = std::min(unix_now() + kGraceS, give_up);
      while (!gone() && unix_now() < until)
        if (!sleep_unless_stopped(0.2)) refuse_on_signal(reservation);
      if (!gone()) return l;
      continue;  // it ended: ask the ledger again (it may have given the lease back, or renewed)
    }
    const std::string whose =
        held.reservation == reservation
            ? fmt::format("reservation {} is", reservation)
            : fmt::format("reservation {}'s devices are still in reservation {}'s lease,",
                          reservation, held.reservation);
    const double now = unix_now(), wait = std::max(0.0, held.expires - now + 0.5);
    if (now + wait > give_up) {
      l.reason = fmt::format(
          "{} held by pid {} of this host ({}), which is no longer running; its lease lapses at "
          "{}, in {}, later than a launch waits ({}): launch again after it",
          whose, held.pid, host, format_utc_iso(held.expires), format_duration(wait),
          format_duration(most_wait_s));
      return l;
    }
    log_warn(
        "lease: {} held by pid {} of this host ({}), which is no longer running (killed before "
        "it could give the lease back): waiting {} for its lease to lapse",
        whose, held.pid, host, format_duration(wait));
    if (!sleep_unless_stopped(wait)) refuse_on_signal(reservation);
    waited.emplace_back(held.reservation, held.pid);
  }
}

LedgerOptions ledger_options_for(const std::string& path) {
  LedgerOptions o;
  const std::string policy = path + ".policy.toml";
  std::error_code ec;
  if (std::filesystem::exists(policy, ec)) {
    // Not a file (a directory made by mistake): the ledger's rules are not what its admins wrote.
    BERTH_CHECK(std::filesystem::is_regular_file(policy, ec),
                "the ledger's policy {} is not a file: remove it, or put the policy TOML there "
                "(docs/reservation.md)",
                policy);
    const PolicyFile p = read_policy_file(policy);
    o.policy.admins = p.admins;
    o.policy.preemptors = p.preemptors;
    o.policy.max_p0_per_owner = p.max_p0_per_owner;
    o.policy.min_notice_s = p.min_notice_s;
    o.policy.start_slack_s = p.start_slack_s;
    o.policy.max_advance_s = p.max_advance_s;
  }
  return o;
}

LeaseKeeper::LeaseKeeper(const RunConfig& cfg, Communicator& world) : cfg_(cfg), world_(world) {
  const ReservationSection& rc = cfg.reservation;
  if (rc.id == 0 && rc.without == "none") return;
  // Every rank's place, on rank 0 (collective).
  const LocalRank local = mpi_local_rank();
  RankPlace mine;
  const std::string host = host_name();
  std::memcpy(mine.host, host.data(), std::min(host.size(), kHostBytes - 1));
  mine.local_rank = local.rank;
  // Its share of what the host (or the job's cgroup) still has, plus what it holds already: the
  // trainer loaded its data and built its model before it takes the lease, and the booking's
  // min_free_mem is the run's whole peak.
  mine.free_bytes =
      host_memory_available_bytes() / std::max(1, local.size) + host_rss_gib() * double(1 << 30);
  std::vector<RankPlace> places(size_t(world.size()));
  world.all_gather(&mine, places.data(),
                   std::vector<size_t>(size_t(world.size()), sizeof(RankPlace)), DType::U8);
  std::string refused;
  if (world.rank() == 0) {
    try {
      // Refused before the ledger is opened: refusing needs none (a missing ledger said only
      // that it does not exist).
      if (rc.id == 0 && rc.without == "refuse") {
        throw LeaseRefused(fmt::format(
            "no reservation: this config requires one (reservation.without = \"refuse\"); book "
            "with `berth reserve --gpus {} --duration ...` and pass --reservation ID",
            world.size()));
      }
      const std::string path = resolve_ledger_path("", rc.ledger);
      LedgerOptions o = ledger_options_for(path);
      o.create = false;
      ledger_ = open_sqlite_ledger(path, o);
      reservation_ = rc.id;
      if (reservation_ == 0) {  // on-demand: a short P3 booking of devices free now
        ReserveRequest q;
        q.count = world.size();
        q.duration_s = rc.on_demand_s;
        q.start = unix_now();
        q.priority = 3;
        q.owner = current_user();
        q.name = "on-demand " + cfg.run.name;
        const BookingResult b = ledger_->reserve(q);
        if (!b.booked) {
          throw LeaseRefused(fmt::format(
              "no on-demand booking of {} device(s) now: {}{}", world.size(), b.reason,
              b.earliest_start > 0 ? "; earliest start " + format_utc_iso(b.earliest_start) : ""));
        }
        reservation_ = b.reservations.front().id;
        on_demand_ = true;
        log_info("lease: booked reservation {} on demand (P3, {})", reservation_,
                 format_duration(rc.on_demand_s));
      }
      // The lease first: whether the booking is active, its window open and nobody else holds
      // it is the answer a user needs before where the ranks run (a cancelled booking is refused
      // as cancelled, whatever the launch). The placement checks below give it back if they fail.
      // (a wait for a dead holder's lease: the other ranks wait in the broadcast below, within
      // their watchdog's limit)
      const double timeout = cfg.parallel.comm_timeout_s;
      const LeaseResult l =
          take_lease(*ledger_, reservation_, host, rc.lease_ttl_s,
                     world.size() > 1 && timeout > 0 ? std::min(600.0, 0.5 * timeout) : 600.0);
      if (!l.ok) throw LeaseRefused("cannot take the lease: " + l.reason);
      const Reservation r = ledger_->reservation(reservation_);
      try {
        check_placement(r, places);
        // A window that ends before the first step could start would stop at once, saving
        // nothing: say so now.
        const double now = unix_now();
        const double needed = stop_reserve_s(rc);
        if (l.lease.window_end - now <= needed) {
          // An on-demand booking is cancelled with this refusal: extending it cannot help.
          const std::string fix =
              on_demand_ ? fmt::format("raise reservation.on_demand_s ({}) well above {}",
                                       format_duration(rc.on_demand_s), format_duration(needed))
                         : fmt::format("extend it (berth extend {} --by 1h)", reservation_);
          throw LeaseRefused(fmt::format(
              "reservation {}'s window ends at {}, in {}, but a run stops {} before it (1.5 × "
              "reservation.checkpoint_estimate_s {} + stop_margin_s {}), so no step could run: "
              "{}, or lower checkpoint_estimate_s if checkpoints are quicker",
              reservation_, format_utc_iso(l.lease.window_end),
              format_duration(std::max(0.0, l.lease.window_end - now)), format_duration(needed),
              format_duration(rc.checkpoint_estimate_s), format_duration(rc.stop_margin_s), fix));
        }
      } catch (const LeaseRefused&) {
        ledger_->release_lease(reservation_, l.lease.token);
        throw;
      }
      token_ = l.lease.token;
      window_end_ = l.lease.window_end;
      last_renew_ = unix_now();
      local_expiry_ = l.lease.expires;
      start_heartbeat(path);
      log_info(
          "lease: reservation {} held with fencing token {} until the window ends at {} "
          "(renewed every {})",
          reservation_, token_, format_utc_iso(window_end_), format_duration(rc.lease_ttl_s / 3));
    } catch (const LeaseRefused& e) {
      refused = e.what();
      try {  // the other ranks wait in the broadcast below: tell them why, whatever happens here
        if (on_demand_) ledger_->cancel(reservation_, current_user());
      } catch (const std::exception& c) {
        log_warn("lease: cancelling on-demand reservation {} failed ({})", reservation_, c.what());
      }
    }
  }
  // Rank 0 tells everyone: the token, or 0 and why not.
  int64_t info[2] = {token_, reservation_};
  try {
    world.broadcast(info, 2, DType::I64, 0);
  } catch (...) {  // no destructor runs for a constructor that throws: end the heartbeat here
    stop_heartbeat();
    throw;
  }
  if (world.rank() != 0) {  // rank 0's heartbeat reads them already
    token_ = info[0];
    reservation_ = info[1];
  }
  if (token_ == 0) throw LeaseRefused(world.broadcast_text(refused));
}

LeaseKeeper::~LeaseKeeper() {
  try {
    release();
  } catch (const std::exception& e) {
    log_warn("lease: release failed ({}); it lapses after its TTL", e.what());
  }
  stop_heartbeat();
}

std::optional<int64_t> LeaseKeeper::token() const {
  if (token_ > 0) return token_;
  return std::nullopt;
}

double LeaseKeeper::window_end() const {
  std::lock_guard<std::mutex> lock(mu_);
  return window_end_;
}

bool LeaseKeeper::preempted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return preempted_;
}

void LeaseKeeper::start_heartbeat(const std::string& path) {
  // Its own connection (one SQLite connection per thread). A renewal that waits for a busy ledger
  // gives up after a sixth of the TTL, so the next one is tried well before the lease lapses.
  LedgerOptions o = ledger_options_for(path);
  o.create = false;
  o.busy_timeout_s = std::clamp(cfg_.reservation.lease_ttl_s / 6, 0.1, 30.0);
  heartbeat_ledger_ = open_sqlite_ledger(path, o);
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

void LeaseKeeper::heartbeat_loop() {
  const double ttl = cfg_.reservation.lease_ttl_s;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !lost_) {
    wake_.wait_for(lock, std::chrono::duration<double>(ttl / 3), [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    LeaseResult l;
    std::string failed;
    try {
      l = heartbeat_ledger_->renew_lease(reservation_, token_, ttl);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    lock.lock();
    if (!failed.empty()) {  // retried after another TTL/3; before_step stops at the expiry
      log_warn("lease: renewal failed ({}); the lease holds until {}", failed,
               format_utc_iso(local_expiry_));
    } else if (!l.ok) {
      lost_ = true;
      lost_reason_ = l.reason;
      // Never cleared: a later refusal (a cancel after the end) does not undo it.
      if (l.window_over) note_window_over(l.lease);
    } else {
      record_renewal(l.lease);
    }
  }
}

void LeaseKeeper::note_window_over(const Lease& lease) {
  window_over_ = true;
  window_end_ = lease.window_end;  // a cut short the renewals had not seen yet
  window_note_ = lease.window_note;
}

bool LeaseKeeper::window_over() const {
  std::lock_guard<std::mutex> lock(mu_);
  return window_over_;
}

void LeaseKeeper::record_renewal(const Lease& lease) {
  // The ledger's expiry, from its clock at the renewal (after any wait for the ledger).
  last_renew_ = unix_now();
  local_expiry_ = std::max(local_expiry_, lease.expires);
  if (lease.window_end != window_end_) {
    const bool cut = lease.window_end < window_end_;
    if (cut && !lease.window_note.empty()) preempted_ = true;
    const std::string why =
        cut ? (lease.window_note.empty() ? " (cut short"
                                         : " (cut short: preempted" + lease.window_note) +
                  "; the run stops with a checkpoint before it)"
            : " (extended)";
    log_info("lease: reservation {}'s window now ends at {}{}", reservation_,
             format_utc_iso(lease.window_end), why);
  }
  window_end_ = lease.window_end;
}

void LeaseKeeper::stop_heartbeat() {
  if (!heartbeat_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  heartbeat_.join();
}

LeaseKeeper::Decision LeaseKeeper::before_step(double step_s, double with_pauses_s) {
  if (!active()) return kContinue;
  int32_t d = kContinue;
  if (ledger_) {
    const ReservationSection& rc = cfg_.reservation;
    bool lost, window_over;
    double expiry, renewed, window_end;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost = lost_;
      window_over = window_over_;
      expiry = local_expiry_;
      renewed = last_renew_;
      window_end = window_end_;
      if (lost) reason_ = lost_reason_;
    }
    double now = unix_now();
    if (lost && window_over) {
      d = window_overrun(now);
    } else if (lost) {
      d = kLost;
    } else if (now + step_s >= expiry) {
      // The heartbeat has not renewed in time (a failing ledger, this process was stopped, or a
      // step longer than the TTL): one renewal here, which holds the lease or says why it is gone.
      std::string failed;
      const LeaseResult l = renew_here(&failed);
      now = unix_now();  // the renewal may have waited for a busy ledger
      if (l.ok) {
        window_end = this->window_end();
        if (now + step_s >= l.lease.expires && !ttl_warned_) {  // the heartbeat renews during it
          ttl_warned_ = true;
          log_warn(
              "lease: a step may take {}, longer than reservation.lease_ttl_s = {}: the lease "
              "then rests on the heartbeat alone; raise lease_ttl_s to at least {}",
              format_duration(step_s), format_duration(rc.lease_ttl_s),
              format_duration(std::ceil(2 * step_s)));
        }
      } else if (l.window_over) {
        d = window_overrun(now);
      } else {
        d = kLost;
        reason_ = failed.empty() ? l.reason
                                 : fmt::format(
                                       "the lease was not renewed since {} and lapses at {}, "
                                       "before the next step could end (renewal: {})",
                                       format_utc_iso(renewed), format_utc_iso(expiry), failed);
      }
    }
    const double stop_at = window_end - stop_reserve();
    if (d == kContinue && now + with_pauses_s >= stop_at) {
      d = kStopWindow;
      reason_ = fmt::format(
          "reservation {}'s window ends at {}; stopping {} before it (1.5 × "
          "checkpoint time {} + margin {})",
          reservation_, format_utc_iso(window_end), format_duration(window_end - now),
          format_duration(checkpoint_s()), format_duration(rc.stop_margin_s));
    }
  }
  return share(d);
}

int32_t LeaseKeeper::window_overrun(double now) {
  // The window closed before the run's check: a step, evaluation or save outlasted the stop
  // margin, or a preemption cut it to (about) now. Nobody can take a reservation's lease after its
  // window, and the checkpoint commit is fenced, so the run still stops with a checkpoint, late by
  // the time the save takes (a grace, as a scheduler's kill wait), instead of losing every step
  // since the last one.
  double window_end;
  std::string note;
  {
    std::lock_guard<std::mutex> lock(mu_);
    window_end = window_end_;
    note = window_note_;
  }
  const ReservationSection& rc = cfg_.reservation;
  const std::string late = format_duration(std::max(0.0, now - window_end));
  if (!note.empty()) {
    log_warn(
        "lease: reservation {}'s window was cut short (preempted{}) and ended at {}, {} "
        "before this check",
        reservation_, note, format_utc_iso(window_end), late);
  } else {
    log_warn(
        "lease: reservation {}'s window ended at {}, {} before this check: a step, evaluation or "
        "checkpoint save outlasted the stop margin (1.5 × checkpoint time + "
        "reservation.stop_margin_s {}; saves took {} so far): raise stop_margin_s above the "
        "longest pause, or reservation.checkpoint_estimate_s ({}) to what a save takes",
        reservation_, format_utc_iso(window_end), late, format_duration(rc.stop_margin_s),
        ckpt_s_ <= 0   ? std::string("none")
        : ckpt_s_ < 60 ? fmt::format("up to {:.2f} s", ckpt_s_)
                       : "up to " + format_duration(ckpt_s_),
        format_duration(rc.checkpoint_estimate_s));
  }
  reason_ = fmt::format(
      "reservation {}'s window ended at {} before the run could stop; the checkpoint is saved "
      "after it",
      reservation_, format_utc_iso(window_end));
  return kStopWindow;
}

LeaseKeeper::Decision LeaseKeeper::share(int32_t d) {
  if (d == kLost && ledger_) {  // nothing left to renew or give back
    stop_heartbeat();
    released_ = true;
  }
  world_.broadcast(&d, 1, DType::I32, 0);
  if (d == kLost && reason_.empty()) reason_ = "rank 0 saw it lost; its log says why";
  return Decision(d);
}

LeaseResult LeaseKeeper::renew_here(std::string* failed) {
  LeaseResult l;
  try {
    l = ledger_->renew_lease(reservation_, token_, cfg_.reservation.lease_ttl_s);
  } catch (const std::exception& e) {
    *failed = e.what();
    return l;
  }
  if (l.ok || l.window_over) {
    std::lock_guard<std::mutex> lock(mu_);
    if (l.ok) {
      record_renewal(l.lease);
    } else {
      note_window_over(l.lease);
    }
  }
  return l;
}

LeaseKeeper::Decision LeaseKeeper::confirm_held() {
  if (!active()) return kContinue;
  int32_t d = kContinue;
  if (ledger_ && !released_) {
    bool lost, window_over;
    double expiry;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost = lost_;
      window_over = window_over_;
      expiry = local_expiry_;
      if (lost) reason_ = lost_reason_;
    }
    // Past the window's end (a stop save that overran it): still this run's, nobody else's.
    if (lost && window_over) lost = false;
    if (!lost && !window_over) {
      std::string failed;
      const LeaseResult l = renew_here(&failed);
      if (!l.ok && l.window_over) {
        // renew_here recorded it: the run ends as at its window's end
      } else if (!l.ok && failed.empty()) {
        lost = true;
        reason_ = l.reason;
      } else if (!l.ok && unix_now() >= expiry) {  // the ledger cannot answer, and time is up
        lost = true;
        reason_ = fmt::format("the lease lapsed at {} and the ledger cannot renew it ({})",
                              format_utc_iso(expiry), failed);
      }
    }
    if (lost) d = kLost;
  }
  return share(d);
}

void LeaseKeeper::release() {
  if (!ledger_ || released_ || token_ == 0) return;
  released_ = true;
  stop_heartbeat();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The heartbeat saw it go after the last check: it is another holder's now (a window that
    // ended is not: the run still gives its lease back).
    if (lost_ && !window_over_) {
      log_warn("lease: reservation {} not released: {}", reservation_, lost_reason_);
      return;
    }
  }
  ledger_->release_lease(reservation_, token_);
  // Taken over since the last renewal (this process was stopped past the TTL): the booking is
  // the new holder's, and an on-demand one stays for it.
  const std::optional<Lease> now = ledger_->lease(reservation_);
  if (now && now->token != token_) {
    log_warn("lease: reservation {} is held with token {} now, not {}; leaving it to that holder",
             reservation_, now->token, token_);
    return;
  }
  log_info("lease: reservation {} released (token {})", reservation_, token_);
  if (on_demand_) {
    ledger_->cancel(reservation_, current_user());
    log_info("lease: on-demand reservation {} cancelled", reservation_);
  }
}

}  // namespace berth
