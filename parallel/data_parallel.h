// Data parallelism over the flat gradient buffer: bucketed gradient all-reduce and ZeRO-1 shard
// ranges (pure index arithmetic plus thin calls on a Communicator).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/communicator.h"

namespace berth {

// Elements per rank when n elements are split into `parts` contiguous shards in rank order: the
// first n % parts shards get one element more (uneven sizes allowed, none negative).
std::vector<size_t> shard_counts(int64_t n, int parts);

struct ShardRange {
  int64_t begin = 0, end = 0;  // [begin, end) in elements
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t n, int parts, int index);

// Default bucket: 4 Mi floats (16 MiB), Megatron's order of magnitude for host buffers.
constexpr int64_t kGradBucketElems = int64_t(1) << 22;

// grads[0, n) = Σ over ranks of `comm`, in place, as a sequence of all-reduces of at most
// bucket_elems elements, from the end of the buffer to the start (the order backward produces
// them, so a later overlap with backward keeps the same buckets). Collective over comm.
void all_reduce_gradients(Communicator& comm, float* grads, int64_t n, int64_t bucket_elems);

// The same sum as a ring all-reduce written on grouped send/recv (reduce-scatter ring, then
// all-gather ring, over the shard_counts chunks): each rank sends exactly Σ of n−1 chunks twice,
// i.e. 2(n−1)/n × the buffer, which the communicator's send counters make measurable
// (bench_grad_sync compares it with the theory and with MPI's own all-reduce). `scratch` is
// resized to the largest chunk. Collective over comm; exact for exactly representable values.
void ring_all_reduce(Communicator& comm, float* buf, int64_t n, std::vector<float>* scratch);

}  // namespace berth
