#include "runtime/train/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"

namespace berth {
namespace {

// What a lock's line says of its holder: "pid P on HOST since TIME (LEASE), run DIR", LEASE
// being "no lease", "under a lease" or "under a lease of reservation N". Read by its structure,
// not by searching the line, since DIR is any path (older berths wrote no ", run DIR").
struct LockHolder {
  bool leased = false;
  int64_t reservation = 0;
  std::string run;
};

LockHolder parse_holder(const std::string& line) {
  LockHolder h;
  const size_t sep = line.find("), run ");  // the first: HOST and TIME hold no ')'
  const size_t end = sep == std::string::npos ? line.rfind(')') : sep;
  const size_t open = end == std::string::npos ? std::string::npos : line.rfind(" (", end);
  if (open == std::string::npos) return h;
  const std::string lease = line.substr(open + 2, end - open - 2);
  const std::string of = "under a lease of reservation ";
  h.leased = lease.rfind("under a lease", 0) == 0;
  if (lease.rfind(of, 0) == 0) h.reservation = std::atoll(lease.c_str() + of.size());
  if (sep != std::string::npos) h.run = line.substr(sep + 7);
  return h;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir, const std::string& what, const std::string& run_dir,
                       bool leased, int64_t reservation) {
  const std::string path = dir + "/.berth.lock";
  dir_ = dir;
  path_ = path;
  if (struct stat st{}; ::stat(dir.c_str(), &st) == 0) {
    dir_dev_ = uint64_t(st.st_dev);
    dir_ino_ = uint64_t(st.st_ino);
  }
  std::error_code ec;
  const std::filesystem::path canonical =
      std::filesystem::weakly_canonical(std::filesystem::absolute(run_dir, ec), ec);
  const std::string run = ec ? run_dir : canonical.string();  // as the lock names it
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  BERTH_CHECK(fd_ >= 0, "cannot open {} to lock the {}: {}", path, what, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      log_warn(
          "cannot lock the {} {} ({}: {}): a second `berth train` on it would not be "
          "detected on this file system",
          what, dir, path, std::strerror(err));
      return;  // kept open, unlocked: nothing to release
    }
    ::close(fd_);
    fd_ = -1;
    std::string holder = read_text_file(path);  // who holds it, as it wrote itself in
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    // Two leased launches of one run, or of one booking (a requeue, a launch taking over a
    // holder paused past its TTL): the ledger gives the lease to one of them and the fence lets
    // only that one commit. Two leased runs of other names saving into one directory under two
    // bookings: nothing decides between them, so they are refused as unleased ones are.
    const LockHolder h = parse_holder(holder);
    const bool same_run =
        h.run.empty() ? what == "run directory"  // written by a berth that did not name the run
                      : h.run == run || (reservation > 0 && h.reservation == reservation);
    if (leased && same_run && h.leased) {
      log_warn(
          "the {} {} is also held by {}: under a lease too, so the ledger decides which of "
          "them trains, and the fencing token which may commit",
          what, dir, holder);
      return;
    }
    BERTH_FAIL(
        "the {} {} is in use by another `berth train` ({}): wait for it to end (or stop it: "
        "SIGTERM checkpoints and exits), or give this run another {}. If that process is gone "
        "(its node failed: on NFS a dead host's lock can outlive it), remove {} and launch "
        "again",
        what, dir, holder.empty() ? "it has not written who it is yet" : holder,
        what == "run directory" ? "run.name" : "checkpoint.dir", path);
  }
  const std::string who = fmt::format(
      "pid {} on {} since {} ({}), run {}\n", ::getpid(), host_name(), format_utc_iso(unix_now()),
      !leased           ? std::string("no lease")
      : reservation > 0 ? fmt::format("under a lease of reservation {}", reservation)
                        : std::string("under a lease"),
      run);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != ssize_t(who.size())) {
    log_warn("cannot write {}: {} (a second launch will not be told who holds the {})", path,
             std::strerror(errno), what);
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

bool RunDirLock::in_place() const {
  struct stat held {
  }, there{};
  if (fd_ < 0) return true;  // nothing held: nothing to lose
  // (a file removed on NFS by another host answers ESTALE)
  if (::fstat(fd_, &held) != 0) return errno != ESTALE;
  return ::stat(path_.c_str(), &there) == 0 && held.st_dev == there.st_dev &&
         held.st_ino == there.st_ino;
}

bool RunDirLock::same_directory() const {
  struct stat st {};
  return ::stat(dir_.c_str(), &st) == 0 && uint64_t(st.st_dev) == dir_dev_ &&
         uint64_t(st.st_ino) == dir_ino_;
}

}  // namespace berth
