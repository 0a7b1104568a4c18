// What a block of the tiled tensor-core kernels (flash_bodies.h) is made of, written once for two
// executors:
//   - on the GPU (nvcc): a CUDA block of warps, shared memory, __syncthreads, and 16×16×16 bf16
//     tensor-core products through nvcuda::wmma with fp32 accumulation;
//   - on the host (g++, tests/host_items_backend.h): one host thread plays the whole block. Each
//     warp's part of a phase runs in turn (each_warp), each "lane loop" covers all its elements,
//     barriers are no-ops, bf16 values are floats holding a value rounded to bf16, and mma_tile is
//     a plain loop with wmma's documented contract: element (i, k) of a row-major A at
//     a[i·lda + k], of a column-major A at a[i + k·lda], fp32 accumulation. It also checks what
//     wmma requires and cannot check itself: leading dimensions a multiple of 16 bytes, tile
//     pointers 32-byte aligned (as they would be on the device), K a multiple of 16;
//   - on the host in SIMT mode (kernels/cuda/host_simt.h): a host thread per GPU thread, with the
//     same thread and lane indices and real barriers, so a missing barrier shows as a race.
// So a kernel written on these runs on the CPU in the tests, against the CPU reference, with the
// same tiling, masking and shared-memory layout as on the GPU. What a block keeps from one phase to
// the next lives in shared memory (per-thread registers would not survive the host's turn-taking).
#pragma once

#include <cstddef>
#include <cstdint>

// The two executors give the same names different meanings (a bf16 is 2 bytes under nvcc, a
// 4-byte float under g++), and both kinds of translation unit link into one test binary, so
// everything here and in flash_bodies.h sits in an inline namespace named after its executor:
// one definition per name, as the linker needs.
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <mma.h>

#include <type_traits>
#define BERTH_DEV __device__ inline
#define BERTH_TILES_HD __host__ __device__ inline
#define BERTH_TILES_EXECUTOR device_executor
#else
#include "kernels/cuda/host_simt.h"
#include "kernels/ops.h"
#include "runtime/core/check.h"
#define BERTH_DEV inline
#define BERTH_TILES_HD inline
#define BERTH_TILES_EXECUTOR host_executor
#endif

namespace berth::cuda::tiles {
inline namespace BERTH_TILES_EXECUTOR {

#if defined(__CUDACC__)
using bf16 = __nv_bfloat16;
BERTH_DEV bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
#else
using bf16 =
    float;  // a value rounded to bf16 (kernels/ops.h round_to_bf16), as __float2bfloat16_rn
BERTH_DEV bf16 to_bf16(float x) { return cpu::round_to_bf16(x); }
#endif

constexpr int kWarpSize = 32;
constexpr size_t kSharedAlign = 128;  // every region of a block's shared memory starts so aligned

// The threads of a block: thread `tid` of `n`. On the host, one thread (0 of 1) plays them all,
// or in SIMT mode each plays its own.
struct Team {
  int tid, n;
  BERTH_DEV void sync() const {
#if defined(__CUDACC__)
    __syncthreads();
#else
    if (host_simt::current != nullptr) host_simt::current->sync_block(host_simt::tid);
#endif
  }
};
// The lanes of one warp: lane `lane` of `n` (the host: 0 of 1). Loop over a warp's elements as
// `for (int i = l.lane; i < count; i += l.n)`.
struct Lanes {
  int lane, n;
  BERTH_DEV void sync() const {
#if defined(__CUDACC__)
    __syncwarp();
#else
    if (host_simt::current != nullptr) host_simt::current->sync_warp(host_simt::tid);
#endif
  }
};

// f(warp, lanes) for each of the block's `warps` warps: on the GPU (and the host in SIMT mode)
// each thread calls it once for its own warp; on the host the warps take turns.
template <typename F>
BERTH_DEV void each_warp(const Team& team, int warps, F f) {
#if defined(__CUDACC__)
  (void)warps;
  f(team.tid / kWarpSize, Lanes{team.tid % kWarpSize, kWarpSize});
#else
  if (host_simt::current != nullptr) {
    f(team.tid / kWarpSize, Lanes{team.tid % kWarpSize, kWarpSize});
    return;
  }
  for (int w = 0; w < warps; w++) f(w, Lanes{0, 1});
#endif
}

// Whether `mine` holds for any lane of the warp (__any_sync); every lane must call it.
BERTH_DEV bool any_lane(const Lanes& ln, bool mine) {
#if defined(__CUDACC__)
  (void)ln;
  return __any_sync(0xffffffffu, mine);
#else
  (void)ln;
  if (host_simt::current == nullptr) return mine;  // one "lane" covered every element
  return host_simt::current->any(host_simt::tid, mine);
#endif
}

// Carves a block's shared memory into regions, each aligned to kSharedAlign, in the order they
// are taken. Over a null base it only counts, so a kernel lists its regions once, in a function
// `Regions carve(SharedCarver&)`, for both its size (bytes_of) and its pointers.
struct SharedCarver {
  unsigned char* base = nullptr;
  size_t bytes = 0;
  template <typename T>
  constexpr BERTH_TILES_HD T* take(size_t count) {
    const size_t at = (bytes + kSharedAlign - 1) / kSharedAlign * kSharedAlign;
    bytes = at + count * sizeof(T);
    return base == nullptr ? nullptr : reinterpret_cast<T*>(base + at);
  }
  // A carve's bytes, without memory (a constant: backend.cu checks them against
  // runtime/core/backend.h's tiled_attention_shared_bytes at compile time).
  template <typename Carve>
  static constexpr size_t bytes_of(Carve carve) {
    SharedCarver counter{};
    carve(counter);
    return counter.bytes;
  }
};

// One warp: the 16×16 fp32 tile at c (row-major, leading dimension ldc) becomes
// (accumulate ? c : 0) + A·B, A (16×K) and B (K×16) bf16; kTransA: A is stored column-major
// (A(i, k) = a[i + k·lda]), else row-major (a[i·lda + k]); kTransB likewise for B
// (B(k, j) = b[k + j·ldb] transposed, b[k·ldb + j] not). Every lane of the warp must call it.
template <bool kTransA, bool kTransB>
BERTH_DEV void mma_tile(float* c, int ldc, bool accumulate, const bf16* a, int lda, const bf16* b,
                        int ldb, int K) {
#if defined(__CUDACC__)
  namespace wmma = nvcuda::wmma;
  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  if (accumulate) {
    wmma::load_matrix_sync(acc, c, unsigned(ldc), wmma::mem_row_major);
  } else {
    wmma::fill_fragment(acc, 0.0f);
  }
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayoutB> fb;
  for (int k0 = 0; k0 < K; k0 += 16) {
    wmma::load_matrix_sync(fa, kTransA ? a + size_t(k0) * lda : a + k0, unsigned(lda));
    wmma::load_matrix_sync(fb, kTransB ? b + k0 : b + size_t(k0) * ldb, unsigned(ldb));
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c, acc, unsigned(ldc), wmma::mem_row_major);
#else
  // wmma's requirements, in device bytes: a bf16 is 2 of them, a float here 4, so a bf16 tile
  // pointer that is 32-byte aligned on the device is 16 elements from an aligned region start.
  auto aligned = [](const void* p, size_t elems_of_32_bytes, size_t host_size) {
    return reinterpret_cast<uintptr_t>(p) % (elems_of_32_bytes * host_size) == 0;
  };
  BERTH_CHECK(K % 16 == 0 && lda % 8 == 0 && ldb % 8 == 0 && ldc % 4 == 0,
              "mma_tile: K {} and bf16 leading dimensions {} {} must be multiples of 16 and 8, "
              "the fp32 one {} of 4",
              K, lda, ldb, ldc);
  // SIMT mode: lane 0 computes the tile while the other lanes go on, without waiting for them;
  // so the operands must have been made visible by a barrier before, which the kernels do
  // (wmma's _sync calls do wait for the warp's lanes; the kernels do not lean on that)
  if (host_simt::current != nullptr) {
    host_simt::current->count_mma(host_simt::tid);
    if (host_simt::tid % kWarpSize != 0) return;
  }
  BERTH_CHECK(aligned(c, 8, sizeof(float)), "mma_tile: the fp32 tile is not 32-byte aligned");
  for (int k0 = 0; k0 < K; k0 += 16) {
    BERTH_CHECK(aligned(kTransA ? a + size_t(k0) * lda : a + k0, 16, sizeof(bf16)) &&
                    aligned(kTransB ? b + k0 : b + size_t(k0) * ldb, 16, sizeof(bf16)),
                "mma_tile: a bf16 tile is not 32-byte aligned");
  }
  for (int i = 0; i < 16; i++) {
    for (int j = 0; j < 16; j++) {
      float s = accumulate ? c[i * ldc + j] : 0.0f;
      for (int k = 0; k < K; k++) {
        const float x = kTransA ? a[i + size_t(k) * lda] : a[size_t(i) * lda + k];
        const float y = kTransB ? b[k + size_t(j) * ldb] : b[size_t(k) * ldb + j];
        s += x * y;  // exact: a product of two bf16 values fits in fp32
      }
      c[i * ldc + j] = s;
    }
  }
#endif
}

}  // namespace BERTH_TILES_EXECUTOR
}  // namespace berth::cuda::tiles
