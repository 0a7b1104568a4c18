#include "runtime/core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/core/check.h"

namespace berth {

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

namespace {

constexpr int kTempSlots = 64;
enum SlotState : int { kFree = 0, kFilling = 1, kReady = 2 };
struct TempSlot {
  std::atomic<int> state{kFree};
  char path[4096];
};
TempSlot g_temps[kTempSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads the slots' state");
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Async-signal-safe: atomics, unlink, rmdir, signal, raise.
void remove_temporaries_and_die(int signum) {
  for (int i = kTempSlots - 1; i >= 0; --i) {
    if (g_temps[i].state.load() != kReady) continue;
    if (::unlink(g_temps[i].path) != 0) ::rmdir(g_temps[i].path);
  }
  std::signal(signum, SIG_DFL);
  std::raise(signum);
}

}  // namespace

ScopedTemp::ScopedTemp(const std::string& path) {
  if (path.empty() || path.size() >= sizeof(g_temps[0].path)) return;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = kFree;
    if (!g_temps[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_temps[i].path, path.c_str(), path.size() + 1);
    g_temps[i].state.store(kReady);
    slot_ = i;
    return;
  }
}

void ScopedTemp::release() {
  if (slot_ >= 0) g_temps[slot_].state.store(kFree);
  slot_ = -1;
}

void remove_temporaries_on_signals() {
  for (const int sig : kCleanupSignals) {
    struct sigaction now {};
    if (sigaction(sig, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    for (const int other : kCleanupSignals) sigaddset(&sa.sa_mask, other);
    sigaction(sig, &sa, nullptr);
  }
}

std::string temp_path_for(const std::string& final_path) {
  static int counter = 0;
  return fmt::format("{}.tmp.{}.{}", without_trailing_slashes(final_path),
                     static_cast<long>(getpid()), counter++);
}

void commit_file(const std::string& temp_path, const std::string& final_path) {
  if (std::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp_path.c_str());
    BERTH_FAIL("cannot move {} into place as {}: {}", temp_path, final_path, std::strerror(err));
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = temp_path_for(path);
  ScopedTemp removed_if_killed(tmp);
  {
    std::ofstream out(tmp, std::ios::binary);
    BERTH_CHECK(out.good(), "cannot write {}: {} (check that the directory exists and is writable)",
                path, std::strerror(errno));
    out << text;
    // close() too: on NFS a full disk or quota shows at close, and the file is then cut short.
    if (!out.flush() || (out.close(), out.fail())) {
      const int err = errno;
      std::remove(tmp.c_str());
      BERTH_FAIL("writing {} failed: {}", path, std::strerror(err));
    }
  }
  removed_if_killed.release();
  commit_file(tmp, path);
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;  // a directory opens, then reads as nothing ("invalid JSON", "empty")
  BERTH_CHECK(!std::filesystem::is_directory(path, ec), "{} is a directory; give a file", path);
  std::ifstream in(path, std::ios::binary);
  BERTH_CHECK(in.good(), "cannot read {}: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool same_file_path(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a.empty() || b.empty()) return a == b;  // fs::absolute("") throws
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a), ea);
  const fs::path pb = fs::weakly_canonical(fs::absolute(b), eb);
  if (ea || eb) return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  return pa == pb;
}

void sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) BERTH_FAIL("cannot open {} to sync it to disk: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) BERTH_FAIL("cannot sync {} to disk: {}", path, std::strerror(err));
}

void check_output_file(const std::string& path, const char* what, const char* example_name) {
  BERTH_CHECK(!path.empty(), "{} is empty: give a file name", what);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    BERTH_FAIL("{} '{}' is a directory; give a file name, e.g. {}", what, path,
               (std::filesystem::path(path) / example_name).string());
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    BERTH_FAIL("cannot write {} '{}': '{}' is a file, not a directory; choose another path", what,
               path, dir);
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    BERTH_FAIL(
        "cannot write {} '{}': the directory '{}' does not exist; create it (mkdir -p {}) "
        "or choose another path",
        what, path, dir, dir);
  }
  if (access(dir.c_str(), W_OK) != 0) {
    BERTH_FAIL("cannot write {} '{}': the directory '{}' is not writable ({}); choose another path",
               what, path, dir, std::strerror(errno));
  }
}

void ensure_writable_dir(const std::string& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) BERTH_FAIL("cannot create {} '{}': {}", what, dir, ec.message());
  if (access(dir.c_str(), W_OK) != 0) {
    BERTH_FAIL("{} '{}' is not writable ({}); choose another directory", what, dir,
               std::strerror(errno));
  }
}

void trim_to_whole_lines(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  const uintmax_t tail = std::min<uintmax_t>(size, 1 << 16);  // a last line of up to 64 KiB
  in.seekg(std::streamoff(size - tail));
  std::string end(size_t(tail), '\0');
  if (!in.read(end.data(), std::streamsize(tail)) || end.back() == '\n') return;
  const size_t last = end.rfind('\n');
  if (last == std::string::npos) return;
  in.close();
  std::filesystem::resize_file(path, size - tail + last + 1, ec);
}

namespace {
FileId id_of(const struct stat& st) {
  return FileId{static_cast<unsigned long long>(st.st_dev),
                static_cast<unsigned long long>(st.st_ino)};
}
}  // namespace

FileId file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return id_of(st);
}

bool rewrite_from(std::ofstream& out, const std::string& path, const FileId& opened,
                  std::streamoff at, const std::string& text) {
  if (at < 0 || !out.flush()) return false;
  // Cut through a descriptor of the file checked, not by path again: a takeover that swaps the
  // path between a check and a cut by path would have its file cut.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  const bool mine = ::fstat(fd, &st) == 0 && id_of(st) == opened;
  const bool cut = mine && ::ftruncate(fd, static_cast<off_t>(at)) == 0;
  ::close(fd);
  if (!cut) return false;
  out.seekp(at);
  out << text;
  return bool(out.flush());
}

}  // namespace berth
