// The reservation ledger: who owns which device when (docs/reservation.md).
//
// Devices (the inventory), reservations (half-open [start, end) windows on concrete devices,
// priority P0..P3, owner = OS user) and leases (the running job's hold on a reservation, with a
// fencing token greater than any issued before and a TTL). Every rule is enforced inside one
// serialized write transaction of the store, so concurrent `berth reserve` processes cannot
// double-book a device. The clock is injected, so every time rule is testable.
//
// LedgerStore is the interface; SQLite (WAL, BEGIN IMMEDIATE, synchronous=FULL, busy timeout) on a
// local disk is the embedded store. A PostgreSQL store for multi-node clusters is to
// follow.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cluster/booking.h"

namespace berth {

constexpr double kMaxSegmentS = 7 * 86400.0;  // one reservation lasts at most 7 days
constexpr double kMaxRequestS = 366 * 86400.0;  // one request (its segments) at most a year

// Injectable wall clock (Unix seconds).
using Clock = std::function<double()>;
Clock system_clock();

struct LedgerPolicy {
  std::vector<std::string> admins;     // may cancel/extend anyone's booking; may preempt
  std::vector<std::string> preemptors; // owners allowed to --preempt (besides admins)
  int64_t max_p0_per_owner = 1;        // active P0 bookings per owner
  double min_notice_s = 600;           // a preempted running holder keeps at least this long
  double start_slack_s = 300;          // a lease may be taken this early before the window
  double past_slack_s = 60;            // a requested start this far in the past is still "now"
  double max_advance_s = 366 * 86400.0;  // a booking starts at most this far ahead (a typo'd
                                         // year is refused, not booked)
};

struct ReserveRequest {
  int64_t count = 0;              // devices
  std::string model;              // "" = any
  int64_t min_free_mem_bytes = 0; // per device (checked against device memory at booking, free
                                  // memory at lease time)
  double duration_s = 0;
  std::optional<double> start;    // nullopt = earliest
  int priority = 3;               // 0..3
  std::string name;
  std::string idempotency_key;
  std::string owner;              // OS user
  bool preempt = false;
  bool allow_split = false;       // > 7 days: book chained segments atomically
};

struct Reservation {
  int64_t id = 0;
  std::string name, owner, state;  // state: active | cancelled | preempted
  int priority = 3;
  double start = 0, end = 0, created = 0;
  std::string model;
  int64_t min_free_mem_bytes = 0;
  int64_t chain_prev = 0;  // previous segment of a split booking (0 = none)
  int64_t preempted_by = 0;
  std::string idempotency_key;
  std::vector<Device> devices;
};

// The answer to a booking request. Refusals that are expected outcomes (no window when asked,
// over the P0 limit, too long without --allow-split) are values; malformed requests throw.
struct BookingResult {
  bool booked = false;
  bool replayed = false;                  // idempotent retry: the existing booking
  std::vector<Reservation> reservations;  // one, or the chained segments
  std::vector<Reservation> preempted;     // bookings this one preempted
  double earliest_start = 0;              // when refused for time: the earliest feasible start
  // It is now + the policy's min_notice_s for a running holder: it moves with the clock, so
  // `--start earliest` books it, not that time given again.
  bool earliest_moves = false;
  std::vector<Busy> blockers;             // what blocks the requested start
  std::vector<std::pair<double, double>> proposed_split;  // when refused for length
  std::string reason;                     // why refused, for the user
};

struct Lease {
  int64_t reservation = 0;
  int64_t token = 0;
  std::string host;
  int64_t pid = 0;
  double expires = 0;
  double window_end = 0;  // the reservation's end now (moves on extend or preemption)
  bool released = false;
  std::string window_note;  // renewals: " by reservation N of OWNER (Pk)" once preempted
};

struct LeaseResult {
  bool ok = false;
  Lease lease;
  std::string reason;
  // A renewal refused only because the window has ended: the token is still the holder's, the
  // booking active, and nobody can take a lease after its window, so the holder may still end
  // its run (stop checkpoint, files, release) under it.
  bool window_over = false;
  // An acquisition refused only because a live lease stands in the way (of this reservation, or
  // of another booking's job on one of its devices): that lease (token 0 for another booking's).
  std::optional<Lease> held_by;
};

// Throws Error for a device no ledger keeps (no host, an unknown kind, an index past 4095, a model
// that is not 1..64 printable characters, negative memory). register_devices checks each one;
// `berth devices register` checks its list first, so a bad one starts no new ledger file.
void validate_device(const Device& d);

class LedgerStore {
 public:
  virtual ~LedgerStore() = default;

  // Inserts or updates devices (key: host, kind, index). Returns how many rows changed.
  virtual int64_t register_devices(const std::vector<Device>& devices) = 0;
  virtual std::vector<Device> devices() = 0;

  virtual BookingResult reserve(const ReserveRequest& req) = 0;
  // Active (and, with all, cancelled/preempted) bookings; owner "" = everyone's.
  virtual std::vector<Reservation> reservations(bool all, const std::string& owner) = 0;
  virtual Reservation reservation(int64_t id) = 0;  // throws when unknown
  virtual Reservation cancel(int64_t id, const std::string& user) = 0;
  virtual Reservation extend(int64_t id, double by_s, const std::string& user) = 0;

  // Lease of a reservation for a running job (rank 0) started by `user`, who must own the booking
  // or be a ledger admin: window open (start − slack ≤ now < end), no live holder. The token is
  // greater than any issued before by this ledger.
  virtual LeaseResult acquire_lease(int64_t reservation, const std::string& user,
                                    const std::string& host, int64_t pid, double ttl_s) = 0;
  // Extends the lease to now + ttl if `token` still holds it; refused otherwise (taken over,
  // released, the booking cancelled, the window ended (window_over), or expired).
  virtual LeaseResult renew_lease(int64_t reservation, int64_t token, double ttl_s) = 0;
  virtual void release_lease(int64_t reservation, int64_t token) = 0;  // idempotent
  virtual std::optional<Lease> lease(int64_t reservation) = 0;

  virtual int schema_version() = 0;
};

struct LedgerOptions {
  Clock clock;                      // default: system clock
  bool create = true;               // false: a missing or empty file is refused, not made a ledger
  LedgerPolicy policy;
  double busy_timeout_s = 30;
  double pause_in_transaction_s = 0;  // tests: sleep inside the booking transaction
  int migrate_to = 0;                 // tests: stop migrations at this version (0 = latest)
};

constexpr int kLedgerSchemaVersion = 3;

// Opens (creating it if needed and options.create) the SQLite ledger at `path`: refuses a network
// filesystem, migrates an older schema, refuses a newer one.
std::unique_ptr<LedgerStore> open_sqlite_ledger(const std::string& path, LedgerOptions options);

// --ledger, else $BERTH_LEDGER, else `config_value`, else ~/.local/share/berth/ledger.db.
std::string resolve_ledger_path(const std::string& flag, const std::string& config_value);
std::string default_ledger_path();  // ~/.local/share/berth/ledger.db ("" without $HOME)

// Name of the network filesystem with statfs magic `f_type`, or "" for a local one.
std::string network_filesystem_name(int64_t f_type);

// The OS user running this process.
std::string current_user();

// "P0".."P3" → 0..3; throws with the accepted forms.
int parse_priority(const std::string& text);
// "72h", "90m", "1h30m", "2d", "45s" → seconds; throws on anything else.
double parse_duration(const std::string& text);
// "75GiB", "80GB", "512MiB", "1024B" → bytes; a number without a unit (other than 0) throws.
int64_t parse_bytes(const std::string& text);

}  // namespace berth
