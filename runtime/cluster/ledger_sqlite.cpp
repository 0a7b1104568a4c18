// The embedded ledger store: SQLite in WAL mode on a local disk. Every write runs in
// BEGIN IMMEDIATE (one writer at a time, waiting up to the busy timeout), with synchronous=FULL,
// so a booking is either wholly in the file or not at all, and concurrent processes see each
// other's bookings before deciding.
#include <fcntl.h>
#include <pwd.h>
#include <sqlite3.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "runtime/cluster/ledger.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/decimal.h"
#include "runtime/core/fs.h"
#include "runtime/core/utf8.h"

namespace berth {
namespace {

// ---- thin RAII over the SQLite C API -----------------------------------------------------------

// A damaged ledger (cut short by a full disk, a partial copy, overwritten pages): what to do.
[[noreturn]] void fail_damaged(const std::string& path, const std::string& what,
                               const std::string& detail) {
  BERTH_FAIL(
      "ledger {} is damaged ({}: {}): it holds every booking, so berth will not read or "
      "book on it. Stop the berth processes that use it, then put back a backup taken "
      "before (`sqlite3 LEDGER .backup COPY` takes one while the ledger is in use), or "
      "salvage what is readable into a new file and move that into place: `sqlite3 '{}' "
      ".recover | sqlite3 '{}.recovered'`",
      path, what, detail, path, path);
}

// An SQLite error of `db` while doing `what`. A damaged file (cut short by a full disk, a partial
// copy) gets what to do, not only SQLite's "database disk image is malformed".
[[noreturn]] void fail_sqlite(sqlite3* db, const std::string& what, const std::string& detail) {
  const char* file = sqlite3_db_filename(db, "main");
  const std::string path = file != nullptr && *file != '\0' ? file : "(in memory)";
  const int code = sqlite3_extended_errcode(db);
  if ((code & 0xff) == SQLITE_CORRUPT) fail_damaged(path, what, detail);
  if (code == SQLITE_READONLY_DBMOVED) {
    BERTH_FAIL(
        "ledger {} was moved or deleted while berth had it open ({}: {}): put it back "
        "where it was, then run the command again",
        path, what, detail);
  }
  // A full disk shows as SQLITE_FULL in a transaction, and as an I/O error where SQLite cannot
  // even make its -shm file beside the ledger: both say what to check and that nothing changed.
  if ((code & 0xff) == SQLITE_FULL || (code & 0xff) == SQLITE_IOERR) {
    std::error_code ec;
    const std::string dir = std::filesystem::absolute(path, ec).parent_path().string();
    BERTH_FAIL(
        "ledger {} could not be {}: {} ({}: {}). Nothing was changed (a transaction rolls back "
        "whole): free space there, or repair the disk (`df {}`), then run the command again",
        path, (code & 0xff) == SQLITE_FULL ? "written" : "read or written",
        (code & 0xff) == SQLITE_FULL ? "the file system holding it is full"
                                     : "the file system holding it failed (full, or an I/O error)",
        what, detail, dir.empty() ? "." : dir);
  }
  if ((code & 0xff) == SQLITE_READONLY) {
    BERTH_FAIL(
        "ledger {} cannot be written by this process (uid {}): {}. Bookings, leases and "
        "device registrations write to it: ask its owner for write access to the file and "
        "its directory, or use a ledger of your own (--ledger, $BERTH_LEDGER)",
        path, geteuid(), detail);
  }
  // Busy past the busy timeout: another process holds a write transaction that long (a frozen
  // booking command, a stopped process, a `sqlite3` shell left in a transaction).
  if ((code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_LOCKED) {
    BERTH_FAIL(
        "ledger {} stayed locked by another process for the whole wait ({}: {}). A write "
        "transaction takes milliseconds, so its holder is stuck or stopped: find it (`fuser "
        "{}`: a berth command, or a sqlite3 shell inside BEGIN), end it, then run this again",
        path, what, detail, path);
  }
  BERTH_FAIL("ledger {}: {}: {}", path, what, detail);
}

// The number of characters of `s` if it is valid UTF-8 and printable (no control characters,
// no bidirectional formatting characters, no line or paragraph separators), else -1: names end up
// in terminals, JSON and HTML, where a right-to-left override makes a listing read other than it
// is (CVE-2021-42574, "Trojan Source").
int64_t printable_utf8_length(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    uint32_t cp = 0;
    const int len = utf8_char_at(s, i, &cp);
    if (len == 0 || utf8_acts_on_display(cp)) return -1;
    i += static_cast<size_t>(len);
  }
  return n;
}

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK) {
      fail_sqlite(db, fmt::format("cannot prepare '{}'", sql), sqlite3_errmsg(db));
    }
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(s_, i, v)); }
  Stmt& bind(int i, int v) { return bind(i, int64_t(v)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(s_, i, v)); }
  Stmt& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(s_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT));
  }
  // true while there is a row
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail_sqlite(db_, sqlite3_sql(s_), sqlite3_errmsg(db_));
  }
  void run() {
    while (step()) {
    }
  }
  int64_t i64(int c) const { return sqlite3_column_int64(s_, c); }
  double f64(int c) const { return sqlite3_column_double(s_, c); }
  std::string text(int c) const {
    const unsigned char* t = sqlite3_column_text(s_, c);
    return t ? reinterpret_cast<const char*>(t) : "";
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) BERTH_FAIL("ledger: bind failed: {}", sqlite3_errmsg(db_));
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
};

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    fail_sqlite(db, sql, msg);
  }
}

// BEGIN IMMEDIATE ... COMMIT; rolled back when left by an exception.
class WriteTxn {
 public:
  explicit WriteTxn(sqlite3* db) : db_(db) { exec(db, "BEGIN IMMEDIATE"); }
  ~WriteTxn() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    exec(db_, "COMMIT");
    done_ = true;
  }

 private:
  sqlite3* db_;
  bool done_ = false;
};

// BEGIN ... COMMIT of reads that must see one state of the file, unless a transaction is open
// already (then they are in it).
class ReadTxn {
 public:
  explicit ReadTxn(sqlite3* db) : db_(db), own_(sqlite3_get_autocommit(db) != 0) {
    if (own_) exec(db, "BEGIN");
  }
  ~ReadTxn() {
    if (own_) sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  }
  ReadTxn(const ReadTxn&) = delete;
  ReadTxn& operator=(const ReadTxn&) = delete;

 private:
  sqlite3* db_;
  bool own_;
};

// ---- schema ------------------------------------------------------------------------------------

// Migration N brings the schema from version N-1 to N (PRAGMA user_version).
const char* const kMigrations[] = {
    // 1: the first schema
    "CREATE TABLE devices(id INTEGER PRIMARY KEY, host TEXT NOT NULL, kind TEXT NOT NULL,"
    "  idx INTEGER NOT NULL, model TEXT NOT NULL, memory_bytes INTEGER NOT NULL,"
    "  uuid TEXT NOT NULL DEFAULT '', UNIQUE(host, kind, idx));"
    "CREATE TABLE reservations(id INTEGER PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL,"
    "  priority INTEGER NOT NULL, start REAL NOT NULL, end REAL NOT NULL CHECK(end > start),"
    "  state TEXT NOT NULL, created REAL NOT NULL, idem_key TEXT, chain_prev INTEGER NOT NULL"
    "  DEFAULT 0, model TEXT NOT NULL, min_free_mem INTEGER NOT NULL,"
    "  UNIQUE(owner, idem_key));"
    "CREATE TABLE booked(reservation INTEGER NOT NULL REFERENCES reservations(id),"
    "  device INTEGER NOT NULL REFERENCES devices(id), PRIMARY KEY(reservation, device));"
    "CREATE TABLE leases(reservation INTEGER PRIMARY KEY REFERENCES reservations(id),"
    "  token INTEGER NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, acquired REAL NOT NULL,"
    "  expires REAL NOT NULL, released INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE tokens(id INTEGER PRIMARY KEY CHECK(id = 1), last INTEGER NOT NULL);"
    "INSERT INTO tokens VALUES(1, 0);",
    // 2: who preempted a booking; indexes for the overlap queries
    "ALTER TABLE reservations ADD COLUMN preempted_by INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX booked_device ON booked(device);"
    "CREATE INDEX reservations_window ON reservations(state, end);",
    // 3: the duration a booking was asked for, on its first segment (0 in older rows: its windows
    // as booked). extend and a preemption cut change the windows, not the request an idempotent
    // retry repeats.
    "ALTER TABLE reservations ADD COLUMN asked_s REAL NOT NULL DEFAULT 0;",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kLedgerSchemaVersion);

bool is_admin(const LedgerPolicy& p, const std::string& user) {
  return user == "root" || std::find(p.admins.begin(), p.admins.end(), user) != p.admins.end();
}

std::string priority_name(int p) { return fmt::format("P{}", p); }

}  // namespace

void validate_device(const Device& d) {
  BERTH_CHECK(!d.host.empty() && d.host.size() <= 255, "device host name must be 1..255 chars");
  BERTH_CHECK(d.kind == "gpu" || d.kind == "cpu", "device kind must be 'gpu' or 'cpu', got '{}'",
              d.kind);
  BERTH_CHECK(d.index >= 0 && d.index < 4096, "device index must be in 0..4095, got {}", d.index);
  const int64_t model_chars = printable_utf8_length(d.model);
  BERTH_CHECK(model_chars >= 1 && model_chars <= 64,
              "device {}:{}{}: its model must be 1..64 characters of printable UTF-8 text (it is "
              "matched against reserve --model, which takes only such text)",
              d.host, d.kind, d.index);
  BERTH_CHECK(d.memory_bytes >= 0, "device memory must be >= 0");
}

namespace {

class SqliteLedger : public LedgerStore {
 public:
  SqliteLedger(const std::string& path, LedgerOptions o) : path_(path), o_(std::move(o)) {
    if (!o_.clock) o_.clock = system_clock();
    {  // a device file, a FIFO, a directory: SQLite would write a journal beside it
      std::error_code ec;
      const auto st = std::filesystem::status(path, ec);
      BERTH_CHECK(ec || !std::filesystem::exists(st) || std::filesystem::is_regular_file(st),
                  "ledger '{}' is not a regular file ({}): point --ledger, $BERTH_LEDGER or "
                  "reservation.ledger at the ledger's file",
                  path,
                  std::filesystem::is_directory(st) ? "a directory"
                  : std::filesystem::is_character_file(st) || std::filesystem::is_block_file(st)
                      ? "a device"
                      : "a pipe, socket or other special file");
    }
    if (!o_.create) {  // only `berth devices register` starts a ledger
      std::error_code ec;
      BERTH_CHECK(std::filesystem::exists(path, ec),
                  "ledger '{}' does not exist: check --ledger, $BERTH_LEDGER and "
                  "reservation.ledger, or start one with `berth devices register`",
                  path);
      BERTH_CHECK(std::filesystem::file_size(path, ec) > 0 || ec,
                  "ledger '{}' is an empty file, not a ledger: check the path, or remove it and "
                  "start one with `berth devices register`",
                  path);
    }
    const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
    try {
      ensure_writable_dir(dir.string(), "ledger directory");
    } catch (const Error& e) {
      // Even a query writes beside the ledger (SQLite's WAL keeps -wal and -shm files there), so
      // another directory is no fix for an existing ledger: it would hold none of the bookings.
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) throw;
      BERTH_FAIL(
          "{}. The ledger's directory must be writable even to read it (SQLite keeps its "
          "-wal and -shm files beside it): make it writable again (remount read-write, "
          "fix its permissions), or read a copy with its WAL: `cp {} /tmp/l.db; cp {}-wal "
          "/tmp/l.db-wal; berth reservations --ledger /tmp/l.db`",
          e.what(), path, path);
    }
    // So must the ledger itself be, even to read it: SQLite makes the -wal and -shm files as
    // whoever opens the ledger first, owned by that user with the ledger's mode, and a user who
    // could only read a 0644 ledger left them so that its owner could not open it any more.
    if (std::error_code ec;
        std::filesystem::exists(path, ec) && ::euidaccess(path.c_str(), W_OK) != 0) {
      BERTH_FAIL(
          "ledger {} cannot be written by this process (uid {}), and SQLite's WAL writes even "
          "to read it: the -wal and -shm files this process would leave beside it, owned by "
          "uid {}, would lock the ledger's other users out. Ask its owner for write access (a "
          "team's ledger: `chmod g+w {}`, or one registered with umask 002 in a group "
          "directory; docs/reservation.md), read a copy with its WAL (`cp {} /tmp/l.db; cp {}-wal "
          "/tmp/l.db-wal; berth reservations --ledger /tmp/l.db`), or use a ledger of your own "
          "(--ledger, $BERTH_LEDGER)",
          path, geteuid(), geteuid(), path, path, path);
    }
    struct statfs fs {};
    if (statfs(dir.c_str(), &fs) == 0) {
      const std::string net = network_filesystem_name(int64_t(fs.f_type));
      BERTH_CHECK(net.empty(),
                  "refusing to open the ledger {} on a network filesystem ({}): SQLite's file "
                  "locking is not reliable there, so two bookings could take the same device. Put "
                  "the ledger on a local disk of one host (--ledger or BERTH_LEDGER) and run "
                  "berth reserve there",
                  path, net);
    }
    // A new ledger gets 0666 less the umask, as other files do (SQLite makes 0644 whatever the
    // umask): a group-writable directory and umask 002 give a ledger its group can book on.
    if (o_.create) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd >= 0) ::close(fd);  // EEXIST (or another error, which the open below reports)
    }
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                        nullptr) != SQLITE_OK) {
      const std::string err = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      BERTH_FAIL("cannot open the ledger {}: {}; check the path and its permissions", path, err);
    }
    opened_ = file_id(path);
    try {
      sqlite3_busy_timeout(db_, int(o_.busy_timeout_s * 1000));
      // Reads first: a file that is not a berth ledger is refused before anything is written to
      // it (it was switched to WAL mode, or given the ledger's tables, and then refused).
      const int version = require_berth_schema();
      require_intact();
      switch_to_wal(path);
      exec(db_, "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
      // The write lock only when there is something to migrate: every open took it, so a
      // listing waited out (and then failed on) a stuck writer that readers need not wait for.
      if (version < target_version()) migrate();
    } catch (const Error& e) {
      sqlite3_close(db_);
      db_ = nullptr;
      const std::string what = e.what();
      if (what.find("file is not a database") != std::string::npos) {
        BERTH_FAIL("{} is not a berth ledger (not an SQLite database); point --ledger elsewhere",
                   path);
      }
      throw;
    }
  }
  ~SqliteLedger() override { sqlite3_close(db_); }

  // Processes that open a new ledger at once (two `devices register`, two quickstart jobs) all
  // switch it to WAL mode, and SQLite answers some of them "database is locked" at once, without
  // calling the busy handler (one holds a shared lock that another's switch must wait out, so
  // waiting in place could deadlock): 5 of 20 such pairs failed. The switch is tried again, its
  // statement finalized and so its lock released, until the busy timeout.
  void switch_to_wal(const std::string& path) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.busy_timeout_s);
    for (;;) {
      sqlite3_stmt* st = nullptr;
      int rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, &st, nullptr);
      std::string mode;
      if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        const unsigned char* t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : nullptr;
        if (t != nullptr) mode = reinterpret_cast<const char*>(t);
      }
      const std::string err = sqlite3_errmsg(db_);
      sqlite3_finalize(st);
      const int primary = rc & 0xff;
      if ((primary == SQLITE_BUSY || primary == SQLITE_LOCKED) &&
          std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (rc != SQLITE_ROW) fail_sqlite(db_, "PRAGMA journal_mode=WAL", err);
      BERTH_CHECK(mode == "wal",
                  "ledger {}: cannot switch to WAL mode (is the file a berth ledger on a local "
                  "disk?)",
                  path);
      return;
    }
  }

  // SQLite reports damage only where a statement reads it: a ledger with overwritten pages was
  // listed and booked on. A quick check of every page on any open refuses it (its time grows with
  // the ledger: it reads every page).
  void require_intact() {
    Stmt s(db_, "PRAGMA quick_check(1)");
    const std::string verdict = s.step() ? s.text(0) : std::string("no answer");
    if (verdict != "ok") fail_damaged(path_, "PRAGMA quick_check", verdict);
  }

  int schema_version() override {
    Stmt s(db_, "PRAGMA user_version");
    s.step();
    return int(s.i64(0));
  }

  int64_t register_devices(const std::vector<Device>& devices) override {
    for (const Device& d : devices) validate_device(d);
    WriteTxn t(db_);
    int64_t changed = 0;
    for (const Device& d : devices) {
      Stmt s(db_,
             "INSERT INTO devices(host, kind, idx, model, memory_bytes, uuid) VALUES(?,?,?,?,?,?)"
             " ON CONFLICT(host, kind, idx) DO UPDATE SET model=excluded.model,"
             " memory_bytes=excluded.memory_bytes, uuid=excluded.uuid"
             // an unchanged row is not updated: it counted as "new or changed" every time
             " WHERE model IS NOT excluded.model OR memory_bytes IS NOT excluded.memory_bytes"
             " OR uuid IS NOT excluded.uuid");
      s.bind(1, d.host).bind(2, d.kind).bind(3, d.index).bind(4, d.model).bind(5, d.memory_bytes)
          .bind(6, d.uuid)
          .run();
      changed += sqlite3_changes(db_);
    }
    t.commit();
    return changed;
  }

  std::vector<Device> devices() override {
    std::vector<Device> out;
    Stmt s(db_, "SELECT id, host, kind, idx, model, memory_bytes, uuid FROM devices "
                "ORDER BY host, kind, idx");
    while (s.step()) {
      out.push_back(Device{s.i64(0), s.text(1), s.text(2), s.i64(3), s.text(4), s.i64(5),
                           s.text(6)});
    }
    return out;
  }

  BookingResult reserve(const ReserveRequest& asked) override {
    const double now = o_.clock();
    // Windows are whole seconds, as they are shown: the duration rounded up (an on-demand booking
    // sized from a config asks for fractions), the start below.
    ReserveRequest req = asked;
    req.duration_s = std::ceil(req.duration_s - 1e-6);
    WriteTxn t(db_);
    BookingResult out;
    validate_request(asked);
    // A retry of a booked request replays it before the start's bounds: its --start may be in the
    // past by now (compared with when it was booked instead).
    std::optional<Reservation> key_taken;  // by another request
    if (!req.idempotency_key.empty()) {
      Stmt s(db_,
             "SELECT id, asked_s FROM reservations WHERE owner=? AND idem_key=? AND chain_prev=0");
      s.bind(1, req.owner).bind(2, req.idempotency_key);
      if (s.step()) {
        Reservation r = load(s.i64(0));
        std::vector<Reservation> chain = chain_of(r);
        // The duration asked for: an extension or a preemption cut since does not make the retry
        // another request (a booking made before schema 3: its windows).
        double total = s.f64(1);
        if (total <= 0)
          for (const Reservation& c : chain) total += c.end - c.start;
        // The start as asked, or as booked from it (one up to past_slack_s ago started then).
        const bool same_start =
            !req.start || std::fabs(*req.start - r.start) < 1e-6 ||
            (*req.start >= r.created - o_.policy.past_slack_s &&
             std::fabs(std::floor(std::max(*req.start, r.created)) - r.start) < 1e-6);
        const bool same = int64_t(r.devices.size()) == req.count && r.model == req.model &&
                          r.priority == req.priority &&
                          (std::fabs(total - req.duration_s) < 1e-6 ||
                           std::fabs(total - asked.duration_s) < 1e-6) &&  // booked unrounded
                          r.min_free_mem_bytes == req.min_free_mem_bytes &&
                          same_start;
        if (same) {
          // Every segment still as booked: a replay that printed a cancelled segment's id sent a
          // script to train under it.
          for (const Reservation& c : chain) {
            const std::string what =
                c.state != "active" ? c.state
                : c.preempted_by != 0
                    ? fmt::format("cut short by reservation {}, which preempted it", c.preempted_by)
                    : "";
            BERTH_CHECK(
                what.empty(),
                "idempotency key '{}' belongs to reservation {}{}, which is {}; use a new "
                "key to book again{}",
                req.idempotency_key, r.id,
                c.id != r.id ? fmt::format(" (its segment {})", c.id) : "", what,
                chain.size() > 1 ? fmt::format(" (its segments: {})", chain_states(chain)) : "");
          }
          out.booked = true;
          out.replayed = true;
          out.reservations = chain;
          return out;
        }
        key_taken = r;
      }
    }
    check_start_bounds(asked, now);
    BERTH_CHECK(!key_taken,
                "idempotency key '{}' was already used by {} for a different request "
                "(reservation {}); use a new key",
                req.idempotency_key, req.owner, key_taken ? key_taken->id : 0);
    const std::vector<Device> devs = devices();
    check_model_and_count(req, devs);
    if (req.preempt && !is_admin(o_.policy, req.owner)) {
      const auto& p = o_.policy.preemptors;
      BERTH_CHECK(std::find(p.begin(), p.end(), req.owner) != p.end(),
                  "{} may not preempt other bookings: the ledger policy lists who may "
                  "(preemptors, admins); book without --preempt to get the earliest start",
                  req.owner);
    }
    if (req.priority == 0) {
      // Bookings, not rows: the chained segments of a split booking count once (by their first).
      std::set<int64_t> heads;
      Stmt s(db_,
             "SELECT id FROM reservations WHERE owner=? AND priority=0 AND "
             "state='active' AND end>?");
      s.bind(1, req.owner).bind(2, now);
      while (s.step()) heads.insert(chain_head(s.i64(0)));
      const int64_t held = int64_t(heads.size());
      if (held >= o_.policy.max_p0_per_owner) {
        out.reason = fmt::format(
            "{} already holds {} active P0 booking(s), and the ledger's policy allows {} "
            "(max_p0_per_owner); cancel one or book at P1",
            req.owner, held, o_.policy.max_p0_per_owner);
        return out;
      }
    }
    // Bookings start on whole seconds, as they are shown and asked for: the request's start (now,
    // for earliest) rounded down, so a lease taken at once finds its window open even with no
    // start slack; find_slot's later candidates (ends of other bookings) rounded up.
    const double start = std::floor(std::max(now, req.start.value_or(now)));
    if (req.duration_s > kMaxSegmentS + 1e-9 && !req.allow_split) {
      for (double s = start; s < start + req.duration_s - 1e-9; s += kMaxSegmentS) {
        out.proposed_split.push_back({s, std::min(s + kMaxSegmentS, start + req.duration_s)});
      }
      out.reason = fmt::format(
          "{} ({} s) is longer than the 7-day limit of one booking ({} s); "
          "book it as {} chained segments with --allow-split (these, where the devices are "
          "free then; else from the earliest start they allow)",
          format_duration(req.duration_s), req.duration_s, kMaxSegmentS, out.proposed_split.size());
      return out;
    }
    const std::vector<Busy> busy = active_busy(now);
    SlotRequest sr;
    sr.count = req.count;
    sr.model = req.model;
    sr.min_memory_bytes = req.min_free_mem_bytes;
    sr.start = start;
    sr.duration_s = req.duration_s;
    sr.priority = req.priority;
    sr.preempt = req.preempt;
    // A running holder of a booking being preempted keeps at least the minimum notice: the
    // search weighs that against devices that need no cut (the earliest start of either).
    sr.notice_until = now + o_.policy.min_notice_s;
    const SlotAnswer ans = find_slot(devs, busy, sr);
    BERTH_CHECK(ans.found, "no feasible window found for {} device(s)", req.count);
    std::string notice;  // a running booking in the way that gets its notice, for a refusal
    for (const Busy& b : ans.blockers) {
      if (req.preempt && b.running && b.priority > req.priority && b.start < sr.notice_until) {
        notice = fmt::format(
            "; reservation {} is running there and gets the policy's min_notice_s ({}) before "
            "it is preempted",
            b.reservation, format_duration(o_.policy.min_notice_s));
      }
    }
    // The horizon binds the earliest start as it binds an explicit one (the start offered must be
    // bookable): past it, nothing is booked and no start is offered.
    if (ans.start > now + o_.policy.max_advance_s) {
      out.blockers = ans.blockers;
      out.reason = fmt::format(
          "the earliest feasible start, {}, is {} ahead, past the {} this ledger books ahead "
          "(policy max_advance_s): fewer devices or a shorter window may start sooner, or ask "
          "its admin to raise the limit",
          format_utc_iso(ans.start), format_duration(ans.start - now),
          format_duration(o_.policy.max_advance_s));
      return out;
    }
    if (req.start && ans.start > start + 1e-9) {
      out.earliest_start = ans.start;
      out.earliest_moves =
          !notice.empty() && std::fabs(ans.start - std::ceil(sr.notice_until)) < 1e-9;
      out.blockers = ans.blockers;
      out.reason = "the devices are booked when asked" + notice;
      return out;
    }
    if (o_.pause_in_transaction_s > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(o_.pause_in_transaction_s));
    }
    // Preempt, then write the booking (one segment, or chained segments of <= 7 days).
    std::set<int64_t> done;
    for (const Busy& b : ans.preempted) {
      if (!done.insert(b.reservation).second) continue;
      out.preempted.push_back(load(b.reservation));
    }
    int64_t prev = 0;
    for (double s = ans.start; s < ans.start + req.duration_s - 1e-9; s += kMaxSegmentS) {
      const double e = std::min(s + kMaxSegmentS, ans.start + req.duration_s);
      Stmt ins(db_,
               "INSERT INTO reservations(name, owner, priority, start, end, state, created, "
               "idem_key, chain_prev, model, min_free_mem, asked_s) "
               "VALUES(?,?,?,?,?,'active',?,?,?,?,?,?)");
      ins.bind(1, req.name).bind(2, req.owner).bind(3, req.priority).bind(4, s).bind(5, e)
          .bind(6, now);
      // the key stays on the first segment only (unbound = NULL)
      if (!req.idempotency_key.empty() && prev == 0) ins.bind(7, req.idempotency_key);
      ins.bind(8, prev)
          .bind(9, req.model)
          .bind(10, req.min_free_mem_bytes)
          .bind(11, prev == 0 ? req.duration_s : 0.0)
          .run();
      const int64_t id = sqlite3_last_insert_rowid(db_);
      for (int64_t d : ans.devices) {
        Stmt b(db_, "INSERT INTO booked(reservation, device) VALUES(?,?)");
        b.bind(1, id).bind(2, d).run();
      }
      prev = id;
      out.reservations.push_back(Reservation{});
      out.reservations.back().id = id;
    }
    for (const Reservation& p : out.preempted) {
      const int64_t first = out.reservations.front().id;
      if (live_lease(p.id, now)) {
        // Running: its window now ends where the new booking starts (>= now + notice); the
        // holder learns it at its next renewal and stops with a checkpoint before then. One that
        // took its lease early (start_slack_s) runs from now: its window starts now.
        Stmt u(db_,
               "UPDATE reservations SET start=MIN(start, ?), end=?, preempted_by=? WHERE id=?");
        u.bind(1, std::floor(now)).bind(2, ans.start).bind(3, first).bind(4, p.id).run();
      } else {
        Stmt u(db_, "UPDATE reservations SET state='preempted', preempted_by=? WHERE id=?");
        u.bind(1, first).bind(2, p.id).run();
      }
    }
    for (Reservation& r : out.reservations) r = load(r.id);
    for (Reservation& p : out.preempted) p = load(p.id);
    t.commit();
    out.booked = true;
    return out;
  }

  std::vector<Reservation> reservations(bool all, const std::string& owner) override {
    const double now = o_.clock();
    std::vector<int64_t> ids;
    Stmt s(db_, "SELECT id FROM reservations WHERE (?1 OR (state='active' AND end>?2)) AND "
                "(?3='' OR owner=?3) ORDER BY start, id");
    s.bind(1, int64_t(all)).bind(2, now).bind(3, owner);
    while (s.step()) ids.push_back(s.i64(0));
    std::vector<Reservation> out;
    for (int64_t id : ids) out.push_back(load(id));
    return out;
  }

  Reservation reservation(int64_t id) override { return load(id); }

  Reservation cancel(int64_t id, const std::string& user) override {
    WriteTxn t(db_);
    const Reservation r = load(id);
    check_may_change(r, user, "cancel");
    BERTH_CHECK(r.state == "active", "reservation {} is already {}", id, r.state);
    Stmt u(db_, "UPDATE reservations SET state='cancelled' WHERE id=?");
    u.bind(1, id).run();
    t.commit();
    return load(id);
  }

  Reservation extend(int64_t id, double by_s, const std::string& user) override {
    BERTH_CHECK(std::isfinite(by_s) && by_s >= 1, "extend: --by must be at least 1s, got {} s",
                by_s);
    const double now = o_.clock();
    WriteTxn t(db_);
    const Reservation r = load(id);
    check_may_change(r, user, "extend");
    BERTH_CHECK(r.state == "active", "reservation {} is {}; only an active booking can be extended",
                id, r.state);
    BERTH_CHECK(r.end > now, "reservation {} ended at {}; book a new window instead", id,
                format_utc_minute(r.end));
    const double end = std::ceil(r.end + by_s - 1e-6);  // whole seconds, as shown
    BERTH_CHECK(end - r.start <= kMaxSegmentS + 1e-9,
                "extending reservation {} by {} would make it longer than the 7-day limit; book "
                "the extra time as a new reservation starting at {}",
                id, format_duration(by_s), format_utc_iso(r.end));
    std::set<int64_t> mine;
    for (const Device& d : r.devices) mine.insert(d.id);
    std::optional<Busy> first;  // the nearest booking in the way, of any priority
    for (const Busy& b : active_busy(now)) {
      if (b.reservation == id || !mine.count(b.device)) continue;
      if (b.start < end && r.end < b.end && (!first || b.start < first->start)) first = b;
    }
    if (first && first->start - r.end < 1) {  // a window no --by can take (at least 1s)
      BERTH_FAIL(
          "cannot extend reservation {}: its device is booked from its end, {}, by reservation {} "
          "({}, {}), so no extension is possible; book the extra time as a new reservation on "
          "other devices, or ask that booking's owner",
          id, format_utc_minute(r.end), first->reservation, first->owner,
          priority_name(first->priority));
    }
    if (first) {
      BERTH_FAIL(
          "cannot extend reservation {} by {}: its device is booked from {} by "
          "reservation {} ({}, {}); the longest extension possible is {} (--by {}s)",
          id, format_duration(by_s), format_utc_minute(first->start), first->reservation,
          first->owner, priority_name(first->priority),
          format_duration(std::max(0.0, first->start - r.end)),
          int64_t(std::max(0.0, std::floor(first->start - r.end))));
    }
    Stmt u(db_, "UPDATE reservations SET end=? WHERE id=?");
    u.bind(1, end).bind(2, id).run();
    t.commit();
    return load(id);
  }

  LeaseResult acquire_lease(int64_t id, const std::string& user, const std::string& host,
                            int64_t pid, double ttl_s) override {
    BERTH_CHECK(ttl_s > 0, "lease TTL must be > 0");
    const double now = o_.clock();
    WriteTxn t(db_);
    LeaseResult out;
    const Reservation r = load(id);
    if (user != r.owner && !is_admin(o_.policy, user)) {
      out.reason = fmt::format(
          "reservation {} belongs to {}, and {} may not train on it (only the "
          "owner or a ledger admin may): book your own with berth reserve",
          id, r.owner, user);
      return out;
    }
    if (r.state != "active") {
      // Who took it, and the way on: a new booking, under which the run continues from its last
      // checkpoint.
      out.reason = fmt::format(
          "reservation {} is {}{}: book again with `berth reserve` (`--start earliest` takes the "
          "first free window) and train under the new booking with --resume auto",
          id, r.state, preempted_by_note(r));
      return out;
    }
    if (now < r.start - o_.policy.start_slack_s) {
      out.reason = fmt::format("reservation {}'s window opens at {} (in {})", id,
                               format_utc_iso(r.start), format_duration(r.start - now));
      return out;
    }
    if (now >= r.end) {
      out.reason = fmt::format("reservation {}'s window ended at {}", id, format_utc_iso(r.end));
      return out;
    }
    if (const std::optional<Lease> l = live_lease(id, now)) {
      out.reason = fmt::format("reservation {} is already held by pid {} on {} (token {}, until "
                               "{} unless renewed); a second launch cannot share it",
                               id, l->pid, l->host, l->token, format_utc_iso(l->expires));
      out.held_by = *l;
      return out;
    }
    // A device another booking's job runs on is never leased twice, whatever that booking's
    // state: the booking before still running (or past its window, finishing its save), a
    // preempted one in its notice, a cancelled one whose job stops at its next renewal, or the
    // owner's next booking that took its lease early while this one's job had stopped.
    std::map<int64_t, const Device*> mine;
    for (const Device& d : r.devices) mine[d.id] = &d;
    for (const auto& [device, dev] : mine) {
      Stmt q(db_,
             "SELECT l.reservation, l.pid, l.host, l.expires FROM leases l JOIN booked b ON "
             "b.reservation = l.reservation WHERE b.device=? AND l.reservation<>? AND "
             "l.released=0 AND l.expires>? ORDER BY l.expires DESC");
      q.bind(1, device).bind(2, id).bind(3, now);
      if (!q.step()) continue;
      out.reason = fmt::format(
          "reservation {}: its device {} still runs reservation {}'s job (pid {} on {}): a device "
          "is leased to one job at a time; launch again once that job has stopped (its lease "
          "lapses at {} unless renewed)",
          id, device_name(*dev), q.i64(0), q.i64(1), q.text(2), format_utc_iso(q.f64(3)));
      Lease other;
      other.reservation = q.i64(0), other.pid = q.i64(1), other.host = q.text(2);
      other.expires = q.f64(3);
      out.held_by = other;
      return out;
    }
    // Before this window opens (start_slack_s), another booking's window on its devices between
    // now and its start holds it back too: that owner may be relaunching within it, or has yet
    // to launch (a short booking in the minutes before). The owner's own booking before does not,
    // once begun and its job stopped: the same run goes on (a batch script resumes under the next
    // booking at once after exit 3; the next segment of a split).
    if (now < r.start) {
      for (const Busy& b : active_busy(now)) {
        if (b.reservation == id || !mine.count(b.device) || b.start >= r.start) continue;
        if (b.owner == r.owner && b.start <= now) continue;
        out.reason = fmt::format(
            "reservation {}'s window opens at {} (in {}), and its device {} is reservation {}'s "
            "until {}: a lease is taken early only on devices no booking holds; launch again at "
            "the window's start",
            id, format_utc_iso(r.start), format_duration(r.start - now),
            device_name(*mine[b.device]), b.reservation, format_utc_iso(b.end));
        return out;
      }
    }
    Stmt tok(db_, "UPDATE tokens SET last=last+1 WHERE id=1 RETURNING last");
    tok.step();
    const int64_t token = tok.i64(0);
    tok.run();
    Stmt up(db_, "INSERT INTO leases(reservation, token, host, pid, acquired, expires, released) "
                 "VALUES(?,?,?,?,?,?,0) ON CONFLICT(reservation) DO UPDATE SET "
                 "token=excluded.token, host=excluded.host, pid=excluded.pid, "
                 "acquired=excluded.acquired, expires=excluded.expires, released=0");
    up.bind(1, id).bind(2, token).bind(3, host).bind(4, pid).bind(5, now).bind(6, now + ttl_s)
        .run();
    t.commit();
    out.ok = true;
    out.lease = Lease{id, token, host, pid, now + ttl_s, r.end, false, ""};
    return out;
  }

  LeaseResult renew_lease(int64_t id, int64_t token, double ttl_s) override {
    require_same_file();
    WriteTxn t(db_);
    const double now = o_.clock();  // after any wait for a busy ledger: an expiry during it counts
    LeaseResult out;
    const std::optional<Lease> l = lease_row(id);
    const Reservation r = load(id);
    if (!l || l->token != token) {
      out.reason = fmt::format("the lease of reservation {} is now held with token {} (this "
                               "holder has {}): another launch took it over",
                               id, l ? l->token : 0, token);
    } else if (l->released) {
      out.reason = fmt::format("the lease of reservation {} was released", id);
    } else if (r.state != "active") {
      out.reason = fmt::format("reservation {} was {}{}", id, r.state, preempted_by_note(r));
    } else if (now >= r.end && l->expires >= r.end) {
      // Held until the window closed (after it nobody can take a lease): the holder may still end
      // its run. A lease that lapsed before the end is expired, below: anyone could have taken it.
      out.reason = fmt::format("reservation {}'s window ended at {}", id, format_utc_iso(r.end));
      out.window_over = true;
      out.lease = *l;
      out.lease.window_end = r.end;
      out.lease.window_note = preempted_by_note(r);
    } else if (now >= l->expires) {
      out.reason = fmt::format(
          "the lease of reservation {} expired at {} (not renewed within its "
          "TTL)",
          id, format_utc_iso(l->expires));
    }
    if (!out.reason.empty()) return out;
    Stmt u(db_, "UPDATE leases SET expires=? WHERE reservation=? AND token=?");
    u.bind(1, now + ttl_s).bind(2, id).bind(3, token).run();
    t.commit();
    out.ok = true;
    out.lease = *l;
    out.lease.expires = now + ttl_s;
    out.lease.window_end = r.end;
    out.lease.window_note = preempted_by_note(r);
    return out;
  }

  void release_lease(int64_t id, int64_t token) override {
    WriteTxn t(db_);
    Stmt u(db_, "UPDATE leases SET released=1 WHERE reservation=? AND token=?");
    u.bind(1, id).bind(2, token).run();
    t.commit();
  }

  std::optional<Lease> lease(int64_t id) override { return lease_row(id); }

 private:
  int target_version() const { return o_.migrate_to > 0 ? o_.migrate_to : kLedgerSchemaVersion; }

  // The ledger's schema version, refusing a file that is no berth ledger (or none yet, unless
  // this open may create one). Reads only.
  int require_berth_schema() {
    // One read: a version read before another process's first migration committed and a table
    // count read after it took a new ledger for a foreign database (1 of 10 racing registrations).
    const ReadTxn snapshot(db_);
    const int v = schema_version();
    // A negative version indexed before the migrations (garbage run as SQL, or a crash).
    BERTH_CHECK(v >= 0,
                "{} has schema version {}, which no berth writes: it is not a berth ledger, or it "
                "is damaged; point --ledger at the right file, or put back a backup",
                path_, v);
    BERTH_CHECK(v <= kLedgerSchemaVersion,
                "the ledger {} has schema version {}, newer than this berth understands ({}): it "
                "was written by a newer berth; use that version (downgrades are refused)",
                path_, v, kLedgerSchemaVersion);
    if (v == 0) {
      Stmt s(db_, "SELECT COUNT(*) FROM sqlite_master");
      s.step();
      BERTH_CHECK(s.i64(0) == 0,
                  "{} is an SQLite database but not a berth ledger (it has tables and no berth "
                  "schema version); point --ledger at a new file",
                  path_);
      // An SQLite file with no tables (another program's empty database, or a ledger whose
      // first registration never committed) became a ledger on a listing.
      BERTH_CHECK(o_.create,
                  "{} is an SQLite database with no berth tables: not a ledger yet. Check "
                  "--ledger, $BERTH_LEDGER and reservation.ledger, or start the ledger there "
                  "with `berth devices register`",
                  path_);
    }
    return v;
  }

  void migrate() {
    WriteTxn t(db_);
    int v = require_berth_schema();  // again under the lock: another process may have migrated
    for (const int target = target_version(); v < target; ++v) {
      exec(db_, kMigrations[v]);
      exec(db_, fmt::format("PRAGMA user_version={}", v + 1).c_str());
    }
    t.commit();
  }

  // The request's fields (check_start_bounds checks its start against now).
  void validate_request(const ReserveRequest& q) const {
    BERTH_CHECK(q.count >= 1 && q.count <= 4096,
                "--gpus must be between 1 and 4096, got {}", q.count);
    // Windows are kept and shown to the second; a shorter one is lost in the start time's
    // rounding (a 1e-7 s window booked nothing).
    BERTH_CHECK(std::isfinite(q.duration_s) && q.duration_s >= 1,
                "--duration must be at least 1s (the window must end after it starts), got {} s",
                q.duration_s);
    BERTH_CHECK(q.duration_s <= kMaxRequestS, "--duration {} is longer than a year",
                format_duration(q.duration_s));
    BERTH_CHECK(q.priority >= 0 && q.priority <= 3, "priority must be P0..P3, got {}", q.priority);
    BERTH_CHECK(q.min_free_mem_bytes >= 0, "--min-free-mem must be >= 0");
    for (const auto& [flag, text, most] : {std::tuple{"--name", &q.name, 64},
                                           std::tuple{"--idempotency-key", &q.idempotency_key, 128},
                                           std::tuple{"--model", &q.model, 64}}) {
      const int64_t chars = printable_utf8_length(*text);
      BERTH_CHECK(chars >= 0,
                  "{} must be printable UTF-8 text (no control characters, bidirectional "
                  "overrides, line separators or invalid bytes): it is shown in terminals, JSON "
                  "and HTML",
                  flag);
      BERTH_CHECK(chars <= most, "{} is {} characters; at most {}", flag, chars, most);
    }
    BERTH_CHECK(!q.owner.empty(), "booking without an owner");
    if (q.start) BERTH_CHECK(std::isfinite(*q.start), "--start is not a valid time");
  }

  // A --start not in the past (past_slack_s) nor past the horizon (max_advance_s).
  void check_start_bounds(const ReserveRequest& q, double now) const {
    if (q.start) {
      BERTH_CHECK(*q.start >= now - o_.policy.past_slack_s,
                  "--start {} is in the past (now is {}); give a future time or --start earliest",
                  format_utc_iso(*q.start), format_utc_iso(now));
      if (*q.start > now + o_.policy.max_advance_s) {
        BERTH_FAIL(
            "--start {} is {} ahead; this ledger books at most {} ahead (policy "
            "max_advance_s): check the date, or ask its admin to raise the limit",
            format_utc_iso(*q.start), format_duration(*q.start - now),
            format_duration(o_.policy.max_advance_s));
      }
    }
  }

  static void check_model_and_count(const ReserveRequest& q, const std::vector<Device>& devs) {
    BERTH_CHECK(!devs.empty(),
                "the ledger has no devices; register them first: berth devices register "
                "(this host's GPUs), --from cluster.toml, or --cpu-slots N");
    std::set<std::string> models;
    for (const Device& d : devs) models.insert(d.model);
    if (!q.model.empty() && !models.count(q.model)) {
      std::string known;
      for (const std::string& m : models) known += (known.empty() ? "" : ", ") + m;
      BERTH_FAIL("unknown model '{}': the ledger's devices are {}", q.model, known);
    }
    SlotRequest sr;
    sr.model = q.model;
    sr.min_memory_bytes = q.min_free_mem_bytes;
    const int64_t n = int64_t(matching_devices(devs, sr).size());
    BERTH_CHECK(n >= q.count,
                "{} device(s) requested but only {} match{} (model {}, memory >= {:.1f} GiB): ask "
                "for fewer or register more",
                q.count, n, n == 1 ? "es" : "", q.model.empty() ? "any" : q.model,
                double(q.min_free_mem_bytes) / (1024.0 * 1024 * 1024));
  }

  void check_may_change(const Reservation& r, const std::string& user, const char* what) const {
    BERTH_CHECK(user == r.owner || is_admin(o_.policy, user),
                "{} may not {} reservation {}: it belongs to {} (only the owner or a ledger admin "
                "may)",
                user, what, r.id, r.owner);
  }

  std::vector<Busy> active_busy(double now) {
    std::vector<Busy> out;
    Stmt s(db_, "SELECT b.device, r.id, r.start, r.end, r.priority, r.owner FROM booked b JOIN "
                "reservations r ON r.id = b.reservation WHERE r.state='active' AND r.end > ?");
    s.bind(1, now);
    std::map<int64_t, bool> running;  // per reservation
    while (s.step()) {
      const int64_t id = s.i64(1);
      if (!running.count(id)) running[id] = live_lease(id, now).has_value();
      // A holder that took its lease early (start_slack_s) holds its devices from now on.
      const double start = running[id] ? std::min(s.f64(2), std::floor(now)) : s.f64(2);
      out.push_back(Busy{s.i64(0), id, start, s.f64(3), int(s.i64(4)), s.text(5), running[id]});
    }
    return out;
  }

  Reservation load(int64_t id) {
    Stmt s(db_, "SELECT id, name, owner, state, priority, start, end, created, model, "
                "min_free_mem, chain_prev, preempted_by, COALESCE(idem_key,'') FROM reservations "
                "WHERE id=?");
    s.bind(1, id);
    BERTH_CHECK(s.step(), "no reservation {} in the ledger {}; `berth reservations --all` lists them",
                id, path_);
    Reservation r;
    r.id = s.i64(0);
    r.name = s.text(1);
    r.owner = s.text(2);
    r.state = s.text(3);
    r.priority = int(s.i64(4));
    r.start = s.f64(5);
    r.end = s.f64(6);
    r.created = s.f64(7);
    r.model = s.text(8);
    r.min_free_mem_bytes = s.i64(9);
    r.chain_prev = s.i64(10);
    r.preempted_by = s.i64(11);
    r.idempotency_key = s.text(12);
    Stmt d(db_, "SELECT d.id, d.host, d.kind, d.idx, d.model, d.memory_bytes, d.uuid FROM booked b "
                "JOIN devices d ON d.id = b.device WHERE b.reservation=? ORDER BY d.host, d.idx");
    d.bind(1, id);
    while (d.step()) {
      r.devices.push_back(Device{d.i64(0), d.text(1), d.text(2), d.i64(3), d.text(4), d.i64(5),
                                 d.text(6)});
    }
    return r;
  }

  // The first segment of the chain `id` belongs to (itself when it follows none).
  int64_t chain_head(int64_t id) {
    for (;;) {
      Stmt s(db_, "SELECT chain_prev FROM reservations WHERE id=?");
      s.bind(1, id);
      if (!s.step() || s.i64(0) == 0) return id;
      id = s.i64(0);
    }
  }

  // "7 active, 8 cancelled": each segment of a chain and its state.
  static std::string chain_states(const std::vector<Reservation>& chain) {
    std::string out;
    for (const Reservation& c : chain)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", c.id,
                         c.state == "active" && c.preempted_by != 0 ? "cut short" : c.state);
    return out;
  }

  std::vector<Reservation> chain_of(const Reservation& first) {
    std::vector<Reservation> out = {first};
    for (;;) {
      Stmt s(db_, "SELECT id FROM reservations WHERE chain_prev=?");
      s.bind(1, out.back().id);
      if (!s.step()) return out;
      out.push_back(load(s.i64(0)));
    }
  }

  std::optional<Lease> lease_row(int64_t id) {
    Stmt s(db_, "SELECT token, host, pid, expires, released FROM leases WHERE reservation=?");
    s.bind(1, id);
    if (!s.step()) return std::nullopt;
    return Lease{id, s.i64(0), s.text(1), s.i64(2), s.f64(3), 0, s.i64(4) != 0, ""};
  }

  // " by reservation 9 of ops (P0)" for a booking that was preempted (or cut short), else "".
  std::string preempted_by_note(const Reservation& r) {
    if (r.preempted_by == 0) return "";
    const Reservation p = load(r.preempted_by);
    return fmt::format(" by reservation {} of {} ({})", p.id, p.owner, priority_name(p.priority));
  }

  std::optional<Lease> live_lease(int64_t id, double now) {
    std::optional<Lease> l = lease_row(id);
    if (!l || l->released || l->expires <= now) return std::nullopt;
    return l;
  }

  // A renewal on a connection opened long ago (a training run's heartbeat) went on in a ledger
  // file removed or replaced since (rm, a backup moved over it): SQLite writes to the file it has
  // open, which nobody else reads any more, so a booking made in the new file at that path could
  // take the devices this lease holds. Throws, naming what happened, when the path no longer
  // names the file opened.
  void require_same_file() const {
    const FileId now = file_id(path_);
    if (now == FileId{}) {
      BERTH_FAIL(
          "the ledger {} was removed after this process opened it ({}): its lease is "
          "recorded nowhere that others read; put the ledger file back",
          path_, std::strerror(errno));
    }
    BERTH_CHECK(now == opened_,
                "the ledger {} was replaced by another file after this process opened it: its "
                "lease is not in the file others read now; put the ledger that was there back",
                path_);
  }

  std::string path_;
  LedgerOptions o_;
  sqlite3* db_ = nullptr;
  FileId opened_;  // the ledger file opened (require_same_file)
};

}  // namespace

Clock system_clock() {
  return [] { return unix_now(); };
}

std::unique_ptr<LedgerStore> open_sqlite_ledger(const std::string& path, LedgerOptions options) {
  BERTH_CHECK(!path.empty(), "ledger path is empty");
  return std::make_unique<SqliteLedger>(path, std::move(options));
}

std::string resolve_ledger_path(const std::string& flag, const std::string& config_value) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("BERTH_LEDGER"); env && *env) return env;
  if (!config_value.empty()) return config_value;
  std::string path = default_ledger_path();
  BERTH_CHECK(!path.empty(), "no ledger path: pass --ledger, set BERTH_LEDGER or HOME");
  return path;
}

std::string default_ledger_path() {
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + "/.local/share/berth/ledger.db" : "";
}

std::string network_filesystem_name(int64_t f_type) {
  switch (static_cast<uint32_t>(f_type)) {
    case 0x6969: return "NFS";
    case 0x517B: return "SMB";
    case 0xFF534D42: return "CIFS";
    case 0xFE534D42: return "SMB2";
    case 0x5346414F: return "AFS";
    case 0x00C36400: return "CephFS";
    case 0x0BD00BD0: return "Lustre";
    case 0x47504653: return "GPFS";
    case 0x65735546: return "FUSE (e.g. sshfs)";
    case 0x19830326: return "FhGFS/BeeGFS";
    default: return "";
  }
}

std::string current_user() {
  if (const passwd* pw = getpwuid(geteuid()); pw && pw->pw_name) return pw->pw_name;
  return fmt::format("uid{}", geteuid());
}

int parse_priority(const std::string& text) {
  if (text.size() == 2 && (text[0] == 'P' || text[0] == 'p') && text[1] >= '0' && text[1] <= '3') {
    return text[1] - '0';
  }
  BERTH_FAIL("--priority '{}' is not a priority: use P0 (highest), P1, P2 or P3 (lowest)", text);
}

double parse_duration(const std::string& text) {
  constexpr double kMaxDurationS = 3650 * 86400.0;  // a bound that keeps the arithmetic exact
  double total = 0, last_unit = 1e300;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    double v = 0;
    const size_t used = read_decimal(std::string_view(text).substr(i), &v);
    BERTH_CHECK(used > 0 && i + used < text.size(),
                "cannot read the duration '{}': use a number with a unit, e.g. 72h, 90m, 1h30m, "
                "2d, 45s",
                text);
    i += used;
    const char u = text[i++];
    const double unit = u == 'd' ? 86400 : u == 'h' ? 3600 : u == 'm' ? 60 : u == 's' ? 1 : -1;
    BERTH_CHECK(unit > 0, "unknown unit '{}' in the duration '{}': use d, h, m or s", u, text);
    BERTH_CHECK(unit < last_unit,
                "the duration '{}' repeats a unit or has a larger one after a smaller: give each "
                "of d, h, m, s at most once, largest first, e.g. 1d12h or 1h30m",
                text);
    last_unit = unit;
    total += v * unit;
    any = true;
  }
  BERTH_CHECK(any, "empty duration: use e.g. 72h, 90m, 1h30m");
  BERTH_CHECK(total <= kMaxDurationS,
              "the duration '{}' is longer than 10 years; bookings last at most 7 days (longer "
              "ones in segments with --allow-split)",
              text);
  return total;
}

int64_t parse_bytes(const std::string& text) {
  double v = 0;
  const size_t used = read_decimal(text, &v);
  BERTH_CHECK(used > 0, "cannot read the size '{}': use e.g. 75GiB, 80GB, 512MiB", text);
  const std::string unit = text.substr(used);
  // A bare number is almost always meant in GiB or GB ("--min-free-mem 80"), not in bytes.
  BERTH_CHECK(!unit.empty() || v == 0,
              "the size '{}' has no unit: say {}GiB or {}GB ({}B for bytes)", text, text, text,
              text);
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12}};
  const auto it = kUnits.find(unit);
  BERTH_CHECK(it != kUnits.end(), "unknown unit '{}' in the size '{}': use B, KiB, MiB, GiB, TiB, "
              "KB, MB, GB or TB", unit, text);
  BERTH_CHECK(v * it->second <= 1e18, "the size '{}' is larger than an exabyte", text);
  return static_cast<int64_t>(std::llround(v * it->second));
}

}  // namespace berth
