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

void ring_all_reduce(Communicator& comm, float* buf, int64_t n, std::vector<float>* scratch) {
  const int size = comm.size(), rank = comm.rank();
  if (size == 1) return;
  const std::vector<size_t> counts = shard_counts(n, size);
  std::vector<int64_t> offsets(size_t(size) + 1, 0);
  for (int i = 0; i < size; i++) offsets[size_t(i) + 1] = offsets[size_t(i)] + int64_t(counts[size_t(i)]);
  scratch->resize(*std::max_element(counts.begin(), counts.end()));
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  auto chunk = [&](int k) { return ((k % size) + size) % size; };
  // Reduce-scatter: after step s, chunk (rank − s − 1) holds the sum over s + 2 ranks.
  for (int s = 0; s < size - 1; s++) {
    const int send_c = chunk(rank - s), recv_c = chunk(rank - s - 1);
    comm.group_begin();
    comm.send(buf + offsets[size_t(send_c)], counts[size_t(send_c)], DType::F32, right);
    comm.recv(scratch->data(), counts[size_t(recv_c)], DType::F32, left);
    comm.group_end();
    float* dst = buf + offsets[size_t(recv_c)];
    for (size_t i = 0; i < counts[size_t(recv_c)]; i++) dst[i] += (*scratch)[i];
  }
  // All-gather: rank holds the full sum of chunk (rank + 1); pass the finished chunks around.
  for (int s = 0; s < size - 1; s++) {
    const int send_c = chunk(rank + 1 - s), recv_c = chunk(rank - s);
    comm.group_begin();
    comm.send(buf + offsets[size_t(send_c)], counts[size_t(send_c)], DType::F32, right);
    comm.recv(buf + offsets[size_t(recv_c)], counts[size_t(recv_c)], DType::F32, left);
    comm.group_end();
  }
}

}  // namespace berth
