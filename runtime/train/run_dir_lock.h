// One `berth train` per run directory. Rank 0 holds an exclusive flock on <run dir>/.berth.lock
// while it trains, with "pid P on HOST since TIME (lease token T | no lease)" written in it. A
// second launch on the same run directory (a Slurm requeue while the first job still runs, the
// same command started twice) is refused at start, naming the live holder, instead of both
// writing metrics.jsonl, trace.csv and checkpoints over each other. The lock goes with its
// process (kill -9 included), so nothing stale is left to clean up.
//
// Under a lease the fencing token already decides who may commit (docs/reservation.md): a
// launch that took the lease over from a holder that is still alive (paused past its TTL) goes
// on beside it, with a warning. A file system without flock (some network mounts) warns that
// two launches are not detected there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace berth {

class RunDirLock {
 public:
  // Takes the lock of `run_dir` (which exists) or throws berth::Error naming its holder.
  RunDirLock(const std::string& run_dir, const std::optional<int64_t>& lease_token);
  ~RunDirLock();  // closing the file releases the lock
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace berth
