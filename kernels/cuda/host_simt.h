// The host executor's SIMT mode (kernels/cuda/tiles.h; tests/host_items_backend.h): a block of a
// tiled kernel run by as many host threads as the GPU would run, each with its own thread and lane
// index, so that the block's barriers are real. Team::sync is a barrier of the block's threads,
// Lanes::sync one of the warp's 32, a vote (warp_any) is collected over the warp, and a tensor-core
// product (mma_tile) is computed by lane 0 while the other lanes go on (it does not wait for
// them: a kernel puts a barrier before it). A kernel that reads shared memory another thread
// wrote without a barrier between may then read it too early, as on the GPU, and its results
// differ from the turn-taking executor's; a barrier that not every thread of its group reaches (a
// divergent __syncthreads or __syncwarp) times out with an error instead of hanging.
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

// A reusable barrier of `n` threads that gives up after `timeout` (a thread that never comes) or
// when the block is abandoned.
class Barrier {
 public:
  Barrier(int n, const std::atomic<bool>* abandoned) : n_(n), abandoned_(abandoned) {}
  void arrive_and_wait(const char* what) {
    std::unique_lock<std::mutex> lk(m_);
    if (abandoned_->load()) throw Abandoned{};
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0, gen_++;
      cv_.notify_all();
      return;
    }
    const bool done = cv_.wait_for(lk, std::chrono::seconds(30),
                                   [&] { return gen_ != gen || abandoned_->load(); });
    if (abandoned_->load()) throw Abandoned{};
    BERTH_CHECK(done,
                "host SIMT executor: {} waited 30 s for {} of its {} threads: a barrier not every "
                "thread reaches (divergent __syncthreads/__syncwarp)",
                what, n_ - count_, n_);
  }
  void wake() {
    const std::lock_guard<std::mutex> lk(m_);
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  uint64_t gen_ = 0;
  const std::atomic<bool>* abandoned_;
};

// The barriers and vote slots of one block of `threads` threads (a multiple of 32).
class BlockSync {
 public:
  explicit BlockSync(int threads) : block_(threads, &abandoned_), votes_(size_t(threads)) {
    for (int w = 0; w < threads / 32; w++)
      warps_.push_back(std::make_unique<Barrier>(32, &abandoned_));
  }
  BlockSync(const BlockSync&) = delete;
  BlockSync& operator=(const BlockSync&) = delete;

  void sync_block() { block_.arrive_and_wait("a block barrier (__syncthreads)"); }
  void sync_warp(int warp) { warps_[size_t(warp)]->arrive_and_wait("a warp barrier (__syncwarp)"); }
  // __any_sync over warp `warp`: every lane of it must call.
  bool any(int warp, int lane, bool mine) {
    votes_[size_t(warp * 32 + lane)] = mine ? 1 : 0;
    sync_warp(warp);
    bool r = false;
    for (int l = 0; l < 32; l++) r = r || votes_[size_t(warp * 32 + l)] != 0;
    sync_warp(warp);  // every lane has read the votes before any lane votes again
    return r;
  }
  // After a thread has failed: the others leave their barriers (throwing Abandoned).
  void abandon() {
    abandoned_.store(true);
    block_.wake();
    for (const auto& b : warps_) b->wake();
  }

 private:
  std::atomic<bool> abandoned_{false};
  Barrier block_;
  std::vector<std::unique_ptr<Barrier>> warps_;
  std::vector<char> votes_;  // one slot per thread, written by it alone
};

// The block this host thread plays a thread of, and its thread index; null outside SIMT mode.
inline thread_local BlockSync* current = nullptr;
inline thread_local int tid = 0;

}  // namespace berth::cuda::tiles::host_simt
