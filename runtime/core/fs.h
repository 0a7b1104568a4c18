// Small file-system helpers shared by every writer: outputs are written to a temporary next to the
// destination and renamed into place, so a crash never leaves a half-written file under the final
// name.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

namespace berth {

// `path` without trailing '/' (a directory written "out/"), "/" itself kept.
std::string without_trailing_slashes(std::string path);

// A unique temporary path in the same directory as `final_path` (so rename() is atomic), also
// when `final_path` is a directory written with a trailing '/'.
std::string temp_path_for(const std::string& final_path);

// Atomically replaces `final_path` with `temp_path` (rename). Throws Error on failure.
void commit_file(const std::string& temp_path, const std::string& final_path);

// Writes `bytes` (text or binary) to `path` atomically (temporary + rename).
void write_file_atomic(const std::string& path, const std::string& bytes);

// While a ScopedTemp lives, `path` (a temporary being written) is removed if SIGINT, SIGTERM or
// SIGHUP ends the process (remove_temporaries_on_signals): a data import or model export stopped
// by Ctrl-C or its job's time limit left gigabytes under `<out>.tmp.<pid>.<n>` that nothing swept.
// Newest first, so files inside a temporary directory go before it (an empty directory is
// removed; one with files nobody registered stays). Best effort: past 64 at once, the others are
// not registered; SIGKILL leaves them all.
class ScopedTemp {
 public:
  explicit ScopedTemp(const std::string& path);
  ~ScopedTemp() { release(); }
  // No longer removed on a signal: called just before the temporary is renamed into place, so
  // its name (pid and counter: another host's process may reuse it on a shared file system) is
  // never unlinked after the rename.
  void release();
  ScopedTemp(const ScopedTemp&) = delete;
  ScopedTemp& operator=(const ScopedTemp&) = delete;

 private:
  int slot_ = -1;
};

// Installs the handler ScopedTemp relies on for SIGINT, SIGTERM and SIGHUP, where their action is
// the default (a signal the launcher ignores, nohup's SIGHUP, stays ignored): it removes the
// registered temporaries, then the signal takes its default action, so the exit status still
// names it. berth train has its own handlers (a clean stop with a checkpoint).
void remove_temporaries_on_signals();

// Calls write(tmp) with a temporary path next to `path`, then renames the temporary into place.
// If write throws, the temporary is removed and the error propagates: `path` is untouched.
template <typename Write>
void write_via_temp(const std::string& path, Write&& write) {
  const std::string tmp = temp_path_for(path);
  ScopedTemp removed_if_killed(tmp);
  try {
    write(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  removed_if_killed.release();
  commit_file(tmp, path);
}

// Reads a whole file; throws Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

// Whether two paths name the same file, existing or not ("x.h5", "./x.h5" and a path through a
// symlink to its directory do): their absolute, normalized forms with symlinks resolved as far as
// the paths exist.
bool same_file_path(const std::string& a, const std::string& b);

// Creates `dir` (and parents) if needed and checks that it is writable; throws Error otherwise.
void ensure_writable_dir(const std::string& dir, const char* what);

// fsync of a file or a directory (a directory: its entries, e.g. a rename into it), so it is on
// disk before what depends on it; throws Error naming the path.
void sync_to_disk(const std::string& path);

// Checks, before any work, that a command can write its output file `path` (`what`: "--out"):
// not a directory, and its directory exists and is writable. Throws Error naming the directory;
// for a directory given, it suggests the file `example_name` in it.
void check_output_file(const std::string& path, const char* what, const char* example_name);

// Cuts a text file after its last newline (a line a killed writer cut short); a file that ends in
// one, or is empty, is left as it is.
void trim_to_whole_lines(const std::string& path);

// Which file `path` names now (device and inode); {0, 0} when none.
struct FileId {
  unsigned long long dev = 0, ino = 0;
  bool operator==(const FileId&) const = default;
};
FileId file_id(const std::string& path);

// Replaces what `out` (open on `path`, the file `opened`) wrote from byte `at` on with `text`: the
// file is cut at `at` and `text` written there (the last line of an append-only file, amended in
// place). Returns false when it cannot (`at` < 0, a stream or file error), the file then as it was
// or cut at `at`, and when `path` names another file than `opened` now (a launch that took the
// run directory over replaced it: that file is not cut).
bool rewrite_from(std::ofstream& out, const std::string& path, const FileId& opened,
                  std::streamoff at, const std::string& text);

}  // namespace berth
