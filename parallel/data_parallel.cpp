#include "parallel/data_parallel.h"

#include <algorithm>

#include "runtime/core/check.h"

namespace berth {

std::vector<size_t> shard_counts(int64_t n, int parts) {
  BERTH_CHECK(n >= 0 && parts > 0, "cannot shard {} elements over {} parts", n, parts);
  std::vector<size_t> counts(size_t(parts), size_t(n / parts));
  for (int64_t i = 0; i < n % parts; i++) counts[size_t(i)]++;
  return counts;
}

ShardRange shard_range(int64_t n, int parts, int index) {
  BERTH_CHECK(index >= 0 && index < parts, "shard {} outside [0, {})", index, parts);
  const int64_t base = n / parts, extra = n % parts;
  ShardRange r;
  r.begin = index * base + std::min<int64_t>(index, extra);
  r.end = r.begin + base + (index < extra ? 1 : 0);
  return r;
}

void all_reduce_gradients(Communicator& comm, float* grads, int64_t n, int64_t bucket_elems) {
  BERTH_CHECK(bucket_elems > 0, "gradient bucket size must be positive, got {}", bucket_elems);
  if (comm.size() == 1) return;
  for (int64_t end = n; end > 0;) {
    const int64_t begin = std::max<int64_t>(0, end - bucket_elems);
    comm.all_reduce(grads + begin, size_t(end - begin), ReduceOp::SUM);
    end = begin;
  }
}

}  // namespace berth
