// The fp32 model on a Backend: GPT<float> keeps its buffers in a Backend's memory and runs every op
// there, and AdamW's moments and update live there too. 20 AdamW steps with clipping on packed
// rows must give the CPU backend's mean losses to 1e-5 relative (the bound for a whole
// training step CPU vs GPU in fp32 mode):
//   - test_model_backend (label cpu): on the CUDA backend's op wiring and thread bodies executed
//     on the host (tests/host_items_backend.h): every op of a training step except cuBLAS;
//   - test_model_backend_gpu (label gpu, BERTH_TEST_CUDA): on the CUDA backend, on a GPU; without
//     one it skips and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "packing/packed_batch.h"
#include "runtime/model/gpt.h"
#include "runtime/train/optimizer.h"
#include "tests/host_items_backend.h"
#include "tests/license_corpus.h"
#include "tests/loss_tracking.h"
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
  ASSERT_EQ(cpu.size(), gpu.size());
  EXPECT_LT(cpu.back(), cpu.front() * 0.9) << "the run must learn for the comparison to mean much";
  test::expect_close(gpu.data(), cpu.data(), int64_t(cpu.size()), test::kBackendLoss,
                     "losses, CUDA vs CPU backend");
}
#endif

// bf16 GEMMs against fp32 on the same backend: the tiny config's model (4 layers, d_model 128, 4
// heads, byte vocabulary 257, 4 x 128 tokens a step, AdamW with clipping at 1, 10 warm-up steps
// then cosine to a tenth) on the bytes of /usr/share/common-licenses, 200 steps: tracks fp32's
// losses as tests/loss_tracking.h defines (mean deviation and the last 100 steps' 10-step means
// within 2 %, the descent's within 5 %). The peak learning rate is 1e-3, not the tiny config's
// 3e-3: with fixed windows and no shuffling 3e-3 spikes, and two fp32 runs from different seeds
// then differ by > 20 % in a 10-step mean, so the bound would measure chaos, not precision; at 1e-3
// seeds differ by 9 % and bf16's worst 10-step mean by 0.65 % on 1 OpenBLAS thread and 1.47 % on
// 2 (CPU emulation, AMD EPYC, measured 2026-12-04).
//   - test_model_backend (cpu): bf16 GEMMs emulated on the CPU backend (attention in fp32); and
//     on the CUDA backend's ops run on the host, whose bf16 mode also runs the tiled tensor-core
//     attention (kernels/cuda/flash_bodies.h, bf16 operands) block by block;
//   - test_model_backend_gpu (gpu): cublasGemmEx on tensor cores and the tensor-core attention
//     against cuBLAS fp32 and the fp32 attention.
// test_train checks the same through the trainer with the tiny config itself.
// fp32 on `fp32_be`, bf16 on `bf16_be` (the same backend, or one whose fp32 equals it: the
// host-items backend's fp32 losses equal the CPU backend's to 1e-6,
// ModelOnBackend.HostRunOfTheCudaBackendsOpsTrainsLikeTheCpuBackend).
void expect_bf16_tracks_fp32(Backend& fp32_be, Backend& bf16_be) {
  std::vector<int32_t> text;  // bytes, EOT 256 after each file (as `berth data import` does)
  for (const std::string& f : test::license_corpus_files()) {
    std::ifstream in(f, std::ios::binary);
    for (char c; in.get(c);) text.push_back(int32_t(static_cast<unsigned char>(c)));
    text.push_back(256);
  }
  if (text.size() < 100000) GTEST_SKIP() << "no /usr/share/common-licenses corpus here";
  constexpr int B = 4, T = 128, V = 257;
  auto run = [&](MatmulPrecision precision) {
    Backend* be = precision == MatmulPrecision::kFp32 ? &fp32_be : &bf16_be;
    be->set_matmul_precision(precision);
    GPT<float> model(make_gpt_config(4, 4, 128, V, T), B, T, {}, nullptr, 1, be);
    model.init_weights(1337);
    AdamW opt(model.layout(), AdamWSettings{}, {0, -1}, be);
    std::vector<double> losses;
    for (int step = 0; step < 200; ++step) {
      PackedBatch b;
      b.B = B, b.T = T, b.max_seqlen = T;
      b.cu_seqlens = {0};
      for (int r = 0; r < B; ++r) {
        const size_t at = (size_t(step * B + r) * 7919u * T) % (text.size() - T - 1);
        for (int t = 0; t < T; ++t) {
          b.tokens.push_back(text[at + size_t(t)]);
          b.positions.push_back(t);
          b.targets.push_back(text[at + size_t(t) + 1]);
        }
        b.cu_seqlens.push_back((r + 1) * T);
      }
      model.zero_grad();
      const double loss = model.forward(b) / double(b.n_targets());
      model.backward(b, 1.0f / float(b.n_targets()));
      const double norm = std::sqrt(be->sum_squares(model.grads().data(), model.grads().size()));
      const double lr =  // 10 warm-up steps, then cosine to 1e-4
          step < 10 ? 1e-3 * double(step + 1) / 10.0
                    : 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + std::cos(M_PI * double(step - 10) / 190.0));
      opt.step(model.params().data(), model.grads().data(), lr, norm);
      losses.push_back(loss);
    }
    return losses;
  };
  const std::vector<double> fp32 = run(MatmulPrecision::kFp32);
  const std::vector<double> bf16 = run(MatmulPrecision::kBf16);
  EXPECT_LT(fp32.back(), 0.7 * fp32.front())
      << "the run must learn for the comparison to mean much";
  EXPECT_NE(fp32, bf16) << "bf16 GEMMs must change the losses";
  const test::LossTracking t = test::expect_loss_tracks(bf16, fp32);
  test::print_loss_tracking((bf16_be.name() + ": bf16 vs fp32, 200 steps").c_str(), t, bf16.back(),
                            fp32.back());
}

TEST(ModelOnBackend, Bf16TracksFp32Over200Steps) {
  std::unique_ptr<Backend> be;
#if BERTH_TEST_CUDA
  try {
    be = make_backend("cuda", 0);
  } catch (const Error& e) {
    GTEST_SKIP() << "no CUDA backend here: " << e.what();
  }
#else
  be = make_backend("cpu", 0);
#endif
  expect_bf16_tracks_fp32(*be, *be);
}

#if !BERTH_TEST_CUDA
TEST(ModelOnBackend, Bf16WithTensorCoreAttentionTracksFp32Over200Steps) {
  const std::unique_ptr<Backend> cpu = make_backend("cpu", 0);
  const std::unique_ptr<Backend> items = test::make_host_items_backend();
  expect_bf16_tracks_fp32(*cpu, *items);
}
#endif

}  // namespace
}  // namespace berth
