// Communicator: collectives and point-to-point transfers inside one group of ranks.
//
// Semantics (NCCL's, so the CUDA/NCCL communicator can implement the same interface):
//   - Every collective must be called by every rank of the group, in the same order, with the
//     same count/dtype/op (and the same root for broadcast). Calls are blocking on this
//     implementation: when a call returns, its output is complete and its input may be reused.
//     (On NCCL they are stream-ordered; the MPI implementation's "stream" is the calling thread.)
//   - In-place is allowed where stated: pass the same pointer as `send` and `recv`.
//   - Counts are in elements of `dtype`, not bytes. A count of 0 is valid and moves nothing.
//   - Reductions of exactly representable values (small integers in float) give identical
//     results on every rank and in any reduction order; other values may differ in the last bits
//     between reduction orders, but are identical on every rank of one call.
//   - send/recv between group_begin() and group_end() are posted together and completed at
//     group_end(), so matched pairs (a ring exchange, a pipeline send+recv) cannot deadlock.
//     Outside a group, send and recv each complete before returning (their own one-op group).
//   - Only send/recv may be called inside a group; collectives, split and barrier there are
//     errors, and groups do not nest. Send/recv to this rank itself needs a group (outside one it
//     would wait for itself).
//   - Methods are not thread-safe: one thread per communicator.
// Errors (a failed MPI call, a misused group, bad buffers) throw berth::Error with the rank@host.
// Checks look at this rank's arguments only: a rank that throws leaves its peers waiting in the
// collective, which is why main aborts the whole job (MPI_Abort) on any Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace berth {

enum class DType { F32, F64, I32, I64, U8 };
enum class ReduceOp { SUM, AVG, MAX };

size_t dtype_size(DType t);
template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

// Payload bytes of the calls this rank made, by operation kind, summed over calls: count ×
// dtype size for all_reduce, broadcast, send and recv; Σ counts × dtype size (the whole
// buffer, all ranks' blocks) for reduce_scatter and all_gather. Not wire bytes.
struct CommStats {
  int64_t all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_gather_bytes = 0,
          broadcast_bytes = 0, send_bytes = 0, recv_bytes = 0;
  int64_t calls = 0;
  // Wall time the calling thread spent inside this communicator's calls (collectives, group_end,
  // barrier): on MPI all of it is exposed, i.e. not overlapped with computation.
  double seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[i] = op over ranks of send[i], on every rank; in-place allowed. AVG divides the sum by
  // size() (floating-point dtypes only).
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;

  // Rank r receives, in recv (counts[r] elements), the op-reduction over ranks of the block
  // send[offset_r, offset_r + counts[r]) with offset_r = Σ_{j<r} counts[j]; send holds Σ counts.
  // Uneven counts are allowed (ZeRO shards). Not in-place.
  virtual void reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts,
                              DType dtype, ReduceOp op) = 0;

  // Every rank receives in recv (Σ counts elements) the blocks of all ranks in rank order, rank
  // r's block being its send (counts[r] elements). In-place allowed when send points at this
  // rank's block inside recv.
  virtual void all_gather(const void* send, void* recv, const std::vector<size_t>& counts,
                          DType dtype) = 0;

  // buf on every rank = buf on `root`.
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;

  // Point-to-point to/from `peer` (a rank of this group). See group_begin/group_end above.
  virtual void group_begin() = 0;
  virtual void group_end() = 0;
  // Like group_end, but returns once the group's transfers are posted, so computation can run
  // while they are in flight; wait() completes them. The group's buffers must stay untouched (sent
  // ones unwritten, received ones unread) until wait() returns. One group in flight at a time, and
  // no other call on this communicator in between. (NCCL: the group on its stream, wait = the
  // event.) The default completes at once.
  virtual void group_end_async() { group_end(); }
  virtual void wait() {}
  virtual void send(const void* buf, size_t count, DType dtype, int peer) = 0;
  virtual void recv(void* buf, size_t count, DType dtype, int peer) = 0;

  // A new communicator of the ranks that passed the same `color`, ordered by (key, rank).
  // Collective over this group. color < 0: this rank joins no group and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  virtual void barrier() = 0;

  // Ends the whole job (every rank of every group) with `code`; does not return.
  [[noreturn]] virtual void abort(int code) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // Typed conveniences.
  template <typename T>
  void all_reduce(T* buf, size_t count, ReduceOp op) {
    all_reduce(buf, buf, count, dtype_of<T>(), op);
  }
  template <typename T>
  T all_reduce_value(T value, ReduceOp op) {
    all_reduce(&value, &value, 1, dtype_of<T>(), op);
    return value;
  }
  // `text` as `root` has it, on every rank.
  std::string broadcast_text(std::string text, int root = 0) {
    int64_t n = int64_t(text.size());
    broadcast(&n, 1, DType::I64, root);
    text.resize(size_t(n));
    if (n > 0) broadcast(text.data(), size_t(n), DType::U8, root);
    return text;
  }

 protected:
  CommStats stats_;
};

// The world communicator over MPI_COMM_WORLD (MPI must be initialized), host buffers.
std::unique_ptr<Communicator> make_mpi_world();

// Rank among the ranks of the same host (MPI_Comm_split_type shared), and their count.
struct LocalRank {
  int rank = 0, size = 1;
};
LocalRank mpi_local_rank();  // collective over MPI_COMM_WORLD: every rank must call it

}  // namespace berth
