// One `berth train` per run directory. Rank 0 holds an exclusive flock on <run dir>/.berth.lock
// while it trains, with "pid P on HOST since TIME (no lease | under a lease [of reservation N]),
// run DIR" written in it. A second launch on the same run directory (a Slurm requeue while the
// first job still runs, the same command started twice) is refused at start, naming the live
// holder, instead of both writing metrics.jsonl, trace.csv and checkpoints over each other. On a
// local disk the lock goes with its process (kill -9 included). On NFS, flock is a lock of the
// client host: one held by a node that died lasts until the server lets it go, so the refusal
// says how to break it.
//
// The run's checkpoint.dir (its checkpoints/, or one set elsewhere) gets the same lock: a run of
// another name saving into it would fail a save on the other's step directory, or mix their
// checkpoints so that `--resume auto` continued the other run.
//
// Under a lease the fencing token already decides who may commit (docs/reservation.md): a
// launch under a lease beside a holder under a lease of the same run or booking (one paused past
// its TTL, whose lease the ledger then hands over) goes on, with a warning. A file system that
// refuses flock warns that two launches are not detected there; one that only emulates it per
// host detects nothing.
#pragma once

#include <cstdint>
#include <string>

namespace berth {

class RunDirLock {
 public:
  // Takes the lock of `dir` (which exists) or throws berth::Error naming its holder. `what`:
  // "run directory" or "checkpoint directory"; `run_dir`: this launch's run directory, written
  // into the lock for a refused launch to name; `leased`: this launch trains under a lease
  // (reservation.id, or on demand); `reservation`: that booking's id (0: on demand).
  RunDirLock(const std::string& dir, const std::string& what, const std::string& run_dir,
             bool leased, int64_t reservation = 0);
  ~RunDirLock();  // closing the file releases the lock
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  // False when the lock file this object holds is no longer at <dir>/.berth.lock: the directory
  // was removed (rm -rf) or replaced (mv) since, or the lock file alone removed.
  bool in_place() const;
  // False when <dir> is no longer the directory it was when locked (removed, or replaced).
  bool same_directory() const;

 private:
  std::string dir_, path_;  // <dir>, <dir>/.berth.lock
  uint64_t dir_dev_ = 0, dir_ino_ = 0;
  int fd_ = -1;
};

}  // namespace berth
