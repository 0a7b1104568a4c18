#include "runtime/train/lease_keeper.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "runtime/config/cluster_files.h"
#include "runtime/core/clock.h"
#include "runtime/core/log.h"
#include "runtime/train/step_metrics.h"

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
// of that host (by index), which must exist and have the free memory. Throws LeaseRefused.
void check_placement(const Reservation& r, const std::vector<RankPlace>& places) {
  for (size_t k = 0; k < places.size(); ++k) {
    const RankPlace& p = places[k];
    const int64_t local_rank = int64_t(p.local_rank);
    int64_t on_host = 0;
    for (const Device& d : r.devices) on_host += d.host == p.host;
    if (local_rank >= on_host) {
      std::string booked;
      for (const Device& d : r.devices)
        booked += fmt::format("{}{}:{}{}", booked.empty() ? "" : ", ", d.host, d.kind, d.index);
      throw LeaseRefused(fmt::format(
          "rank {} runs on {} as local rank {}, but reservation {} booked {} device(s) there "
          "({}): launch on the booked hosts, one rank per booked device",
          k, p.host, local_rank, r.id, on_host, booked));
    }
    if (p.free_bytes < double(r.min_free_mem_bytes)) {
      throw LeaseRefused(fmt::format(
          "rank {} on {} has {:.1f} GiB free, reservation {} needs {:.1f} GiB per device", k,
          p.host, p.free_bytes / (1 << 30), r.id, double(r.min_free_mem_bytes) / (1 << 30)));
    }
  }
}

}  // namespace

LedgerOptions ledger_options_for(const std::string& path) {
  LedgerOptions o;
  const std::string policy = path + ".policy.toml";
  std::error_code ec;
  if (std::filesystem::exists(policy, ec)) {
    const PolicyFile p = read_policy_file(policy);
    o.policy.admins = p.admins;
    o.policy.preemptors = p.preemptors;
    o.policy.max_p0_per_owner = p.max_p0_per_owner;
    o.policy.min_notice_s = p.min_notice_s;
    o.policy.start_slack_s = p.start_slack_s;
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
  mine.free_bytes = host_meminfo_bytes("MemAvailable") / std::max(1, local.size);
  std::vector<RankPlace> places(size_t(world.size()));
  world.all_gather(&mine, places.data(),
                   std::vector<size_t>(size_t(world.size()), sizeof(RankPlace)), DType::U8);
  std::string refused;
  if (world.rank() == 0) {
    try {
      const std::string path = resolve_ledger_path("", rc.ledger);
      BERTH_CHECK(std::filesystem::exists(path),
                  "ledger '{}' does not exist: check reservation.ledger and $BERTH_LEDGER (the "
                  "ledger `berth reserve` booked in)",
                  path);
      ledger_ = open_sqlite_ledger(path, ledger_options_for(path));
      reservation_ = rc.id;
      if (reservation_ == 0 && rc.without == "refuse") {
        throw LeaseRefused(fmt::format(
            "no reservation: this config requires one (reservation.without = \"refuse\"); book "
            "with `berth reserve --gpus {} --duration ...` and pass --reservation ID",
            world.size()));
      }
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
      const LeaseResult l = ledger_->acquire_lease(reservation_, host, getpid(), rc.lease_ttl_s);
      if (!l.ok) throw LeaseRefused("cannot take the lease: " + l.reason);
      const Reservation r = ledger_->reservation(reservation_);
      try {
        check_placement(r, places);
      } catch (const LeaseRefused&) {
        ledger_->release_lease(reservation_, l.lease.token);
        throw;
      }
      token_ = l.lease.token;
      window_end_ = l.lease.window_end;
      last_renew_ = unix_now();
      local_expiry_ = last_renew_ + rc.lease_ttl_s;
      log_info("lease: reservation {} held with fencing token {} until the window ends at {} "
               "(renewed every {})",
               reservation_, token_, format_utc_minute(window_end_),
               format_duration(rc.lease_ttl_s / 3));
    } catch (const LeaseRefused& e) {
      refused = e.what();
      if (on_demand_) ledger_->cancel(reservation_, current_user());
    }
  }
  // Rank 0 tells everyone: the token, or 0 and why not.
  int64_t info[2] = {token_, reservation_};
  world.broadcast(info, 2, DType::I64, 0);
  token_ = info[0];
  reservation_ = info[1];
  if (token_ == 0) {
    int64_t n = int64_t(refused.size());
    world.broadcast(&n, 1, DType::I64, 0);
    refused.resize(size_t(n));
    world.broadcast(refused.data(), size_t(n), DType::U8, 0);
    throw LeaseRefused(refused);
  }
}

LeaseKeeper::~LeaseKeeper() {
  try {
    release();
  } catch (const std::exception& e) {
    log_warn("lease: release failed ({}); it lapses after its TTL", e.what());
  }
}

std::optional<int64_t> LeaseKeeper::token() const {
  if (token_ > 0) return token_;
  return std::nullopt;
}

LeaseKeeper::Decision LeaseKeeper::before_step(double step_s) {
  if (!active()) return kContinue;
  int32_t d = kContinue;
  if (ledger_) {
    const ReservationSection& rc = cfg_.reservation;
    double now = unix_now();
    if (now - last_renew_ >= rc.lease_ttl_s / 3) {
      try {
        const LeaseResult l = ledger_->renew_lease(reservation_, token_, rc.lease_ttl_s);
        if (l.ok) {
          last_renew_ = now;
          local_expiry_ = now + rc.lease_ttl_s;
          if (l.lease.window_end != window_end_) {
            log_info("lease: reservation {}'s window now ends at {}", reservation_,
                     format_utc_minute(l.lease.window_end));
          }
          window_end_ = l.lease.window_end;
        } else {
          d = kLost;
          reason_ = l.reason;
        }
      } catch (const Error& e) {
        log_warn("lease: renewal failed ({}); the lease holds until {}", e.what(),
                 format_utc_iso(local_expiry_));
      }
      now = unix_now();
    }
    const double ckpt = ckpt_s_ > 0 ? ckpt_s_ : rc.checkpoint_estimate_s;
    if (d == kContinue && now + step_s >= local_expiry_) {
      d = kLost;
      reason_ = fmt::format("the lease was not renewed since {} and lapses at {}, before the next "
                            "step could end",
                            format_utc_iso(last_renew_), format_utc_iso(local_expiry_));
    }
    const double stop_at = window_end_ - (1.5 * ckpt + rc.stop_margin_s);
    if (d == kContinue && now + step_s >= stop_at) {
      d = kStopWindow;
      reason_ = fmt::format("reservation {}'s window ends at {}; stopping {} before it (1.5 × "
                            "checkpoint time {} + margin {})",
                            reservation_, format_utc_iso(window_end_),
                            format_duration(window_end_ - now), format_duration(ckpt),
                            format_duration(rc.stop_margin_s));
    }
  }
  world_.broadcast(&d, 1, DType::I32, 0);
  return Decision(d);
}

void LeaseKeeper::release() {
  if (!ledger_ || released_ || token_ == 0) return;
  released_ = true;
  ledger_->release_lease(reservation_, token_);
  log_info("lease: reservation {} released (token {})", reservation_, token_);
  if (on_demand_) {
    ledger_->cancel(reservation_, current_user());
    log_info("lease: on-demand reservation {} cancelled", reservation_);
  }
}

}  // namespace berth
