// The fp32 model on a Backend: GPT<float> keeps its buffers in a Backend's memory and runs every op
// there, and AdamW's moments and update live there too. 20 AdamW steps with clipping on packed
// rows must give the CPU backend's mean losses to 1e-5 relative (the bound for a whole
// training step CPU vs GPU in fp32 mode):
//   - test_model_backend (label cpu): on the CUDA backend's op wiring and thread bodies executed
//     on the host (tests/host_items_backend.h): every op of a training step except cuBLAS;
//   - test_model_backend_gpu (label gpu, BERTH_TEST_CUDA): on the CUDA backend, on a GPU; without
//     one it skips and says why.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "packing/packed_batch.h"
#include "runtime/model/gpt.h"
#include "runtime/train/optimizer.h"
#include "tests/host_items_backend.h"
#include "tests/tolerance.h"

namespace berth {
namespace {

constexpr int kB = 2, kT = 16, kVocab = 50;

// Row 0 holds documents of 5, 7 and 4 tokens, row 1 one of 16 (targets −1 at document ends).
PackedBatch packed_batch(uint32_t seed) {
  std::mt19937 rng(seed);
  PackedBatch b;
  b.B = kB, b.T = kT;
  b.cu_seqlens = {0};
  for (const std::vector<int>& row : {std::vector<int>{5, 7, 4}, std::vector<int>{16}}) {
    for (int len : row) {
      for (int i = 0; i < len; ++i) {
        b.tokens.push_back(int32_t(rng() % kVocab));
        b.positions.push_back(i);
        b.targets.push_back(i + 1 < len ? int32_t(rng() % kVocab) : -1);
      }
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
      b.max_seqlen = std::max(b.max_seqlen, int32_t(len));
    }
  }
  check_invariants(b, kVocab, kT);
  return b;
}

// 20 steps of AdamW with global-norm clipping at 1 on `be`; returns the mean losses.
std::vector<double> train(Backend& be) {
  const GPTConfig cfg = make_gpt_config(2, 4, 32, kVocab, kT);
  GPT<float> model(cfg, kB, kT, {}, nullptr, 1, &be);
  model.init_weights(5);
  AdamWSettings settings;
  settings.grad_clip = 1.0;
  AdamW opt(model.layout(), settings, {0, -1}, &be);
  std::vector<double> losses;
  for (int step = 1; step <= 20; ++step) {
    const PackedBatch b = packed_batch(step % 2 + 1);  // two batches, alternating: learnable
    model.zero_grad();
    const double loss = model.forward(b) / double(b.n_targets());
    model.backward(b, 1.0f / float(b.n_targets()));
    const double norm = std::sqrt(be.sum_squares(model.grads().data(), model.grads().size()));
    opt.step(model.params().data(), model.grads().data(), 1e-2, norm);
    losses.push_back(loss);
  }
  return losses;
}

#if !BERTH_TEST_CUDA
TEST(ModelOnBackend, HostRunOfTheCudaBackendsOpsTrainsLikeTheCpuBackend) {
  const std::vector<double> cpu = train(cpu_backend());
  // guarded: the model's and AdamW's host code never reads the backend's memory directly
  auto items = test::make_host_items_backend(true);
  const std::vector<double> gpu_ops = train(*items);
  ASSERT_EQ(cpu.size(), gpu_ops.size());
  EXPECT_LT(cpu.back(), cpu.front() * 0.9) << "the run must learn for the comparison to mean much";
  test::expect_close(gpu_ops.data(), cpu.data(), int64_t(cpu.size()), test::kBackendLoss,
                     "losses, host-items vs CPU backend");
}
#else
TEST(ModelOnBackend, TrainsOnTheGpuLikeOnTheCpu) {
  std::unique_ptr<Backend> be;
  try {
    be = make_backend("cuda", 0);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend here: " << e.what();
  }
  const std::vector<double> cpu = train(cpu_backend());
  const std::vector<double> gpu = train(*be);
  test::expect_close(gpu.data(), cpu.data(), int64_t(cpu.size()), test::kBackendLoss,
                     "losses, CUDA vs CPU backend");
}
#endif

}  // namespace
}  // namespace berth
