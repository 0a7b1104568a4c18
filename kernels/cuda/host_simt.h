// The host executor's SIMT mode (kernels/cuda/tiles.h; tests/host_items_backend.h): a block of a
// tiled kernel run by as many host threads as the GPU would run, each with its own thread and lane
// index, so that the block's barriers are real. Team::sync is a barrier of the block's threads,
// Lanes::sync one of the warp's 32, a vote (warp_any) is collected over the warp, and a tensor-core
// product (mma_tile) is computed by lane 0 while the other lanes go on (it does not wait for
// them: a kernel puts a barrier before it). A kernel that reads shared memory another thread
// wrote without a barrier between may then read it too early, as on the GPU, and its results
// differ from the turn-taking executor's (under ThreadSanitizer, scripts/race_check, the read is
// reported even when the values agree). A barrier that not every thread of its group reaches (a
// divergent __syncthreads or __syncwarp) times out with an error instead of hanging, and each
// barrier checks that the lanes of every warp it joins have made the same number of products.
//
// What it cannot show: a hazard on lane 0's own accesses around a product (on a GPU the
// product's loads and stores are spread over the warp's lanes), and orderings the GPU's memory
// model allows that a host thread never exhibits.
//
// One BlockSync per launch; the launching code sets each worker thread's `current` and `tid`.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/core/check.h"

namespace berth::cuda::tiles::host_simt {

// Thrown in the threads still waiting when another thread of the block has failed.
struct Abandoned {};

// A reusable barrier of the block's threads first … first + n − 1 that gives up after 30 s (a
// thread that never comes) or when the block is abandoned. Rounds alternate between two slots,
// each with its own mutex, so a thread waking late from one round never takes a lock a thread of
// the next round has released: the only order the barrier creates (and ThreadSanitizer sees) is
// the GPU's, arrivals before departures of the same round.
class Barrier {
 public:
  Barrier(int first, int n, const std::atomic<bool>* abandoned)
      : first_(first), n_(n), rounds_(size_t(n), 0), abandoned_(abandoned) {}
  // Thread t arrives and waits for the others. The last to arrive runs `agree()` while the rest
  // wait and, after releasing them, fails with `disagree` when it returns false.
  template <class Agree>
  void arrive_and_wait(int t, const char* what, Agree agree, const char* disagree) {
    Slot& s = slots_[rounds_[size_t(t - first_)]++ & 1];  // t's own round counter
    std::unique_lock<std::mutex> lk(s.m);
    if (abandoned_->load()) throw Abandoned{};
    const uint64_t gen = s.gen;
    if (++s.count == n_) {
      s.count = 0, s.gen++;
      const bool ok = agree();
      s.cv.notify_all();
      lk.unlock();
      BERTH_CHECK(ok, "host SIMT executor: at {}: {}", what, disagree);
      return;
    }
    const bool done = s.cv.wait_for(lk, std::chrono::seconds(30),
                                    [&] { return s.gen != gen || abandoned_->load(); });
    if (abandoned_->load()) throw Abandoned{};
    BERTH_CHECK(done,
                "host SIMT executor: {} waited 30 s for {} of its {} threads: a barrier not every "
                "thread reaches (divergent __syncthreads/__syncwarp)",
                what, n_ - s.count, n_);
  }
  void wake() {
    for (Slot& s : slots_) {
      const std::lock_guard<std::mutex> lk(s.m);
      s.cv.notify_all();
    }
  }

 private:
  struct Slot {
    std::mutex m;
    std::condition_variable cv;
    int count = 0;
    uint64_t gen = 0;
  };
  int first_, n_;
  Slot slots_[2];
  std::vector<uint64_t> rounds_;  // each member's rounds so far, written by it alone
  const std::atomic<bool>* abandoned_;
};

// The barriers, vote slots and tensor-core product counts of one block of `threads` threads (a
// multiple of 32). Every call names the calling thread `t`.
class BlockSync {
 public:
  explicit BlockSync(int threads)
      : threads_(threads),
        block_(0, threads, &abandoned_),
        votes_(size_t(threads)),
        mma_(size_t(threads), 0) {
    for (int w = 0; w < threads / 32; w++)
      warps_.push_back(std::make_unique<Barrier>(32 * w, 32, &abandoned_));
  }
  BlockSync(const BlockSync&) = delete;
  BlockSync& operator=(const BlockSync&) = delete;

  void sync_block(int t) {
    block_.arrive_and_wait(
        t, "a block barrier (__syncthreads)",
        [&] {
          for (int w = 0; w < threads_ / 32; w++)
            if (!lanes_agree(w)) return false;
          return true;
        },
        kMmaDiverged);
  }
  void sync_warp(int t) {
    const int w = t / 32;
    warps_[size_t(w)]->arrive_and_wait(
        t, "a warp barrier (__syncwarp)", [&] { return lanes_agree(w); }, kMmaDiverged);
  }
  // __any_sync over t's warp: every lane of it must call.
  bool any(int t, bool mine) {
    const int w = t / 32;
    votes_[size_t(t)] = mine ? 1 : 0;
    sync_warp(t);
    bool r = false;
    for (int l = 0; l < 32; l++) r = r || votes_[size_t(w * 32 + l)] != 0;
    sync_warp(t);  // every lane has read the votes before any lane votes again
    return r;
  }
  // Thread t takes part in a warp's tensor-core product (every lane of the warp must).
  void count_mma(int t) { mma_[size_t(t)]++; }
  // After a thread has failed: the others leave their barriers (throwing Abandoned).
  void abandon() {
    abandoned_.store(true);
    block_.wake();
    for (const auto& b : warps_) b->wake();
  }

 private:
  static constexpr const char* kMmaDiverged =
      "the lanes of a warp made different numbers of tensor-core products (mma_tile) since the "
      "last barrier: every lane must make each one, as wmma's _sync calls require";
  // Whether warp w's lanes have made as many products each (run while they all wait).
  bool lanes_agree(int w) const {
    for (int l = 1; l < 32; l++)
      if (mma_[size_t(w * 32 + l)] != mma_[size_t(w * 32)]) return false;
    return true;
  }
  int threads_;
  std::atomic<bool> abandoned_{false};
  Barrier block_;
  std::vector<std::unique_ptr<Barrier>> warps_;
  std::vector<char> votes_;    // one slot per thread, written by it alone
  std::vector<uint64_t> mma_;  // products per thread, written by it alone
};

// The block this host thread plays a thread of, and its thread index; null outside SIMT mode.
inline thread_local BlockSync* current = nullptr;
inline thread_local int tid = 0;

}  // namespace berth::cuda::tiles::host_simt
