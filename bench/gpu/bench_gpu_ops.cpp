// The CUDA backend on a GPU, timed (bench/README.md, "bench/gpu"): the model's varlen attention
// forward + backward (causal) at the training shapes, 16 documents of T = 1024 and 4 of T = 4096,
// head size 64, 12 heads (and 6 heads of 128 at 4096), in bf16 precision (the tiled tensor-core
// kernels) and in fp32; the GEMM of GPT-2 124M's MLP at 16 × 1024 tokens and a whole GPT-2 124M
// training step (AdamW) at micro-batch 16 × 1024 as tokens/s and MFU against 989 TFLOP/s, with
// bf16 GEMMs (run.precision) and then fp32; last, ring attention's fp32 block kernels.
// `--precision bf16` or `--precision fp32` runs one half: scripts/gpu_check.sh runs the bf16 half,
// then bench/gpu/torch_reference.py (the same shapes in PyTorch, which the comparison needs), and
// the slower fp32 half last, so a time limit stops that one first. Without CUDA or a GPU it says
// why and exits 0; `--cpu` runs the training step on the CPU backend at B = 1, T = 128 instead
// (bf16 emulated there).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "packing/packed_batch.h"
#include "runtime/core/check.h"
#include "runtime/model/gpt.h"
#include "runtime/train/optimizer.h"

namespace {

using berth::Backend;
using berth::DeviceBuffer;

template <typename F>
double time_ms(Backend& be, int reps, F f) {
  f();  // warm-up (and the pool's first allocations)
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  be.synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

DeviceBuffer<float> random_buffer(Backend& be, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> h(static_cast<size_t>(n));
  for (float& x : h) x = nd(rng);
  DeviceBuffer<float> d(be, n);
  be.upload(d.data(), h.data(), d.bytes());
  return d;
}

void attention(Backend& be, int T, int NH, int HS) {
  const int C = NH * HS, n = T;
  auto q = random_buffer(be, int64_t(n) * C, 1), k = random_buffer(be, int64_t(n) * C, 2),
       v = random_buffer(be, int64_t(n) * C, 3), dout = random_buffer(be, int64_t(n) * C, 4);
  std::vector<int32_t> seq(static_cast<size_t>(n), 0), pos(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) pos[size_t(i)] = i;
  DeviceBuffer<int32_t> d_seq(be, n), d_pos(be, n);
  be.upload(d_seq.data(), seq.data(), d_seq.bytes());
  be.upload(d_pos.data(), pos.data(), d_pos.bytes());
  DeviceBuffer<float> out(be, int64_t(n) * C), lse(be, int64_t(n) * NH), dq(be, int64_t(n) * C),
      dk(be, int64_t(n) * C), dv(be, int64_t(n) * C);
  const double fwd = time_ms(be, 3, [&] {
    be.attention_block_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d_seq.data(),
                               d_pos.data(), d_seq.data(), d_pos.data(), n, n, C, NH);
  });
  const double bwd = time_ms(be, 3, [&] {
    be.zero(dq.data(), dq.bytes()), be.zero(dk.data(), dk.bytes()), be.zero(dv.data(), dv.bytes());
    be.attention_block_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(),
                                lse.data(), q.data(), k.data(), v.data(), d_seq.data(),
                                d_pos.data(), d_seq.data(), d_pos.data(), n, n, C, NH);
  });
  // causal: half of the 4·T²·HS (QKᵀ and PV) per head; backward 2.5× forward
  const double flop_fwd = 4.0 * double(T) * T * HS * NH * 0.5, flop_bwd = 2.5 * flop_fwd;
  std::printf("berth cuda fp32 attention_block T=%-5d NH=%d HS=%d: fwd %.3f ms (%.2f TFLOP/s), "
              "bwd %.3f ms (%.2f TFLOP/s), fwd+bwd %.2f TFLOP/s\n",
              T, NH, HS, fwd, flop_fwd / fwd * 1e-9, bwd, flop_bwd / bwd * 1e-9,
              (flop_fwd + flop_bwd) / (fwd + bwd) * 1e-9);
}

// The model's attention (attention_varlen_*, B documents of T tokens in cu_seqlens, as in a
// micro-batch) in the backend's current precision: fp32, the per-(query, head) kernels; bf16, the
// tiled tensor-core kernels.
void varlen_attention(Backend& be, int B, int T, int NH, int HS) {
  const int C = NH * HS;
  const int64_t N = int64_t(B) * T;
  auto qkv = random_buffer(be, N * 3 * C, 7), dout = random_buffer(be, N * C, 8);
  std::vector<int32_t> cu;
  for (int b = 0; b <= B; ++b) cu.push_back(b * T);
  DeviceBuffer<int32_t> d_cu(be, B + 1);
  be.upload(d_cu.data(), cu.data(), d_cu.bytes());
  DeviceBuffer<float> out(be, N * C), lse(be, N * NH), dqkv(be, N * 3 * C);
  const double fwd = time_ms(be, 10, [&] {
    be.attention_varlen_forward(out.data(), lse.data(), qkv.data(), d_cu.data(), cu.data(), B, C,
                                NH);
  });
  const double bwd = time_ms(be, 10, [&] {
    be.attention_varlen_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(),
                                 d_cu.data(), cu.data(), B, C, NH);
  });
  const double flop_fwd = 4.0 * double(B) * T * T * HS * NH * 0.5, flop_bwd = 2.5 * flop_fwd;
  // "bf16-fallback": bf16 precision, but the fp32 kernels ran (the tiled ones do not fit)
  const bool bf16 = be.matmul_precision() == berth::MatmulPrecision::kBf16;
  std::printf(
      "berth cuda %s attention_varlen B=%-2d T=%-5d NH=%d HS=%d: fwd %.3f ms (%.2f TFLOP/s), "
      "bwd %.3f ms (%.2f TFLOP/s), fwd+bwd %.2f TFLOP/s\n",
      !bf16                              ? "fp32"
      : be.attention_on_tensor_cores(HS) ? "bf16"
                                         : "bf16-fallback",
      B, T, NH, HS, fwd, flop_fwd / fwd * 1e-9, bwd, flop_bwd / bwd * 1e-9,
      (flop_fwd + flop_bwd) / (fwd + bwd) * 1e-9);
  // The tiled backward with 32-query tiles (BERTH_FLASH_BACKWARD_QUERY_TILE, kernels/cuda/
  // item_backend.h): twice the blocks an SM holds where 64 is the default, fewer keys a block.
  if (bf16 && be.attention_on_tensor_cores(HS) &&
      std::getenv("BERTH_FLASH_BACKWARD_QUERY_TILE") == nullptr) {
    setenv("BERTH_FLASH_BACKWARD_QUERY_TILE", "32", 1);
    const double bwd32 = time_ms(be, 10, [&] {
      be.attention_varlen_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(),
                                   d_cu.data(), cu.data(), B, C, NH);
    });
    unsetenv("BERTH_FLASH_BACKWARD_QUERY_TILE");
    std::printf(
        "  the same backward with 32-query tiles: %.3f ms (%.2f TFLOP/s), %.2fx the default's "
        "time\n",
        bwd32, flop_bwd / bwd32 * 1e-9, bwd32 / bwd);
  }
}

// The GEMM in the backend's current precision (bf16: the two rounding passes included).
void gemm(Backend& be, int N, int IC, int OC) {
  auto inp = random_buffer(be, int64_t(N) * IC, 5), w = random_buffer(be, int64_t(OC) * IC, 6);
  DeviceBuffer<float> out(be, int64_t(N) * OC);
  const double ms = time_ms(be, 10, [&] {
    be.matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, IC, OC);
  });
  const bool bf16 = be.matmul_precision() == berth::MatmulPrecision::kBf16;
  std::printf("berth cuda %s matmul_forward %dx%dx%d (%s): %.3f ms, %.2f TFLOP/s\n",
              bf16 ? "bf16" : "fp32", N, IC, OC,
              bf16 ? "cublasGemmEx bf16 in, fp32 out, with the rounding" : "cuBLAS, no TF32", ms,
              2.0 * N * IC * OC / ms * 1e-9);
}

// One AdamW step of GPT-2 124M with the backend's GEMM precision, timed over `reps` steps.
void gpt2_step(Backend& be, int B, int T, int reps) {
  const berth::GPTConfig cfg = berth::make_gpt_config(12, 12, 768, 50257, 1024);
  berth::GPT<float> model(cfg, B, T, {}, nullptr, 1, &be);
  model.init_weights(1);
  berth::AdamW opt(model.layout(), berth::AdamWSettings{}, {0, -1}, &be);
  berth::PackedBatch b;
  b.B = B, b.T = T, b.max_seqlen = T;
  std::mt19937 rng(7);
  for (int r = 0; r < B; ++r) {
    for (int t = 0; t < T; ++t) {
      b.tokens.push_back(int32_t(rng() % 50257));
      b.targets.push_back(int32_t(rng() % 50257));
      b.positions.push_back(t);
    }
  }
  for (int r = 0; r <= B; ++r) b.cu_seqlens.push_back(r * T);
  double loss = 0;
  auto step = [&] {
    model.zero_grad();
    loss = model.forward(b) / double(b.N());
    model.backward(b, 1.0f / float(b.N()));
    const double norm = std::sqrt(be.sum_squares(model.grads().data(), model.grads().size()));
    opt.step(model.params().data(), model.grads().data(), 3e-4, norm);
  };
  const double ms = time_ms(be, reps, step);
  const double flops = double(berth::gpt_flops_per_token(cfg, T)) * B * T;
  std::printf(
      "berth %s %s GPT-2 124M train step B=%d T=%d: %.1f ms, %.0f tok/s, MFU %.2f%% of "
      "989 TFLOP/s (loss %.3f)\n",
      be.kind() == berth::DeviceKind::kCuda ? "cuda" : "cpu",
      berth::matmul_precision_name(be.matmul_precision()), B, T, ms, B * T / ms * 1e3,
      flops / (ms * 1e-3) / 989e12 * 100, loss);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run stopped at its time limit keeps its lines
  if (argc > 1 && std::string(argv[1]) == "--cpu") {  // the step on the CPU backend, small
    std::printf("bench_gpu_ops --cpu: the training step on the CPU backend, B=1 T=128\n");
    auto cpu = berth::make_backend("cpu", 0);
    for (auto p : {berth::MatmulPrecision::kFp32, berth::MatmulPrecision::kBf16}) {
      cpu->set_matmul_precision(p);
      gpt2_step(*cpu, 1, 128, 3);
    }
    return 0;
  }
  std::vector<berth::MatmulPrecision> precisions = {berth::MatmulPrecision::kBf16,
                                                    berth::MatmulPrecision::kFp32};
  // --only step|attention|gemm: one part, so that scripts/gpu_check.sh runs each in its own
  // process (a CUDA error such as an illegal address poisons the process's context, and every
  // later figure of it with it).
  std::string only;
  for (int i = 1; i < argc; i += 2) {
    const std::string opt = argv[i], v = i + 1 < argc ? argv[i + 1] : "";
    if (opt == "--precision" && (v == "bf16" || v == "fp32")) {
      precisions = {v == "bf16" ? berth::MatmulPrecision::kBf16 : berth::MatmulPrecision::kFp32};
    } else if (opt == "--only" && (v == "step" || v == "attention" || v == "gemm")) {
      only = v;
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu_ops [--cpu | [--precision bf16|fp32] "
                   "[--only step|attention|gemm]] (not '%s %s')\n",
                   opt.c_str(), v.c_str());
      return 1;
    }
  }
  if (!berth::cuda_built()) {
    std::printf("bench_gpu_ops: this berth was built without CUDA; nothing to measure\n");
    return 0;
  }
  std::unique_ptr<Backend> be;
  try {
    be = berth::make_backend("cuda", 0);
  } catch (const berth::Error& e) {
    std::printf("bench_gpu_ops: no GPU to measure on: %s\n", e.what());
    return 0;
  }
  std::printf("bench_gpu_ops on %s\n", be->name().c_str());
  // Each figure on its own: an error is printed with what failed, and the others still run
  // (where the error left the device usable).
  int failed = 0;
  auto part = [&](const char* what, const std::function<void()>& run) {
    try {
      run();
    } catch (const std::exception& e) {
      std::printf("berth %s FAILED: %s\n", what, e.what());
      ++failed;
    }
  };
  for (auto p : precisions) {
    be->set_matmul_precision(p);
    const bool bf16 = p == berth::MatmulPrecision::kBf16;
    const char* name = bf16 ? "bf16" : "fp32";
    if (only.empty() || only == "attention") {
      part(name, [&] { varlen_attention(*be, 16, 1024, 12, 64); });
      part(name, [&] { varlen_attention(*be, 4, 4096, 12, 64); });
      part(name, [&] { varlen_attention(*be, 4, 4096, 6, 128); });
    }
    if (only.empty() || only == "gemm") part(name, [&] { gemm(*be, 16 * 1024, 768, 3072); });
    if (only.empty() || only == "step") {
      part(name, [&] { gpt2_step(*be, 16, 1024, bf16 ? 10 : 1); });
    }
  }
  if (precisions.back() == berth::MatmulPrecision::kFp32 && (only.empty() || only == "attention")) {
    for (int T : {1024, 4096}) part("fp32 ring block", [&] { attention(*be, T, 12, 64); });
  }
  std::printf("device pool peak %.1f MiB\n", double(be->peak_bytes()) / (1 << 20));
  return failed > 0 ? 1 : 0;
}
