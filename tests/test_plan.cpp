// The plan's formulas against hand-computed cases and against the model itself: GPT-2 124M's
// parameter count, FLOPs per token equal to the trainer's, activation bytes equal to what GPT
// allocates for each pipeline stage and schedule, communication volumes, the bubble, layout
// ranking with reasons, and profile files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/cluster/plan.h"
#include "runtime/core/check.h"
#include "runtime/model/gpt.h"
#include "runtime/model/gpt_config.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

PlanInput small(int64_t L, int64_t NH, int64_t C, int64_t V, int64_t T, int64_t B) {
  PlanInput in;
  in.model = PlanModel{L, NH, C, V, T};
  in.seq_len = T;
  in.micro_batch_size = B;
  in.steps = 100;
  return in;
}

TEST(Plan, Gpt2SmallHasTheKnownParameterCount) {
  const PlanModel m{12, 12, 768, 50257, 1024};
  const ParamCounts p = count_params(m, PlanLayout{});
  EXPECT_EQ(p.total, 124439808);  // GPT-2 124M with the real vocabulary
  EXPECT_EQ(p.embedding, 50257 * 768 + 1024 * 768);
  EXPECT_EQ(p.padded, 124439808 + (50304 - 50257) * 768);  // Vp = 50304 as stored
  EXPECT_EQ(p.per_stage.size(), 1u);
  // Over 4 stages: every layer once, the tied head's copy on the last stage.
  const ParamCounts s = count_params(m, PlanLayout{1, 4, 1, 1, 0, 4});
  int64_t sum = 0;
  for (int64_t x : s.per_stage) sum += x;
  EXPECT_EQ(sum, p.padded + 50304 * 768);
  EXPECT_EQ(s.per_stage[1], 3 * (12 * 768 * 768 + 13 * 768));
}

TEST(Plan, FlopsPerTokenAreTheTrainersAndHalveAttentionOnGpus) {
  const PlanModel m{12, 12, 768, 50257, 1024};
  const GPTConfig g = make_gpt_config(12, 12, 768, 50257, 1024);
  EXPECT_DOUBLE_EQ(flops_per_token(m, 1024, 0, true), gpt_flops_per_token(g, 1024));
  // 6 · (12·12·768² + 12·13·768 + 2·768 + 50304·768) + 12·12·768·1024 by hand:
  const double matmul = 12.0 * (12 * 768.0 * 768 + 13 * 768) + 2 * 768 + 50304.0 * 768;
  EXPECT_DOUBLE_EQ(flops_per_token(m, 1024, 0, true), 6 * matmul + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(flops_per_token(m, 1024, 0, false), 6 * matmul + 6.0 * 12 * 768 * 1024);
  // Packed rows of 4 documents of 256: Σ L² = 4·256² instead of 1024².
  EXPECT_DOUBLE_EQ(flops_per_token(m, 1024, 4 * 256.0 * 256, true),
                   6 * matmul + 12.0 * 12 * 768 * 256);
}

TEST(Plan, ActivationsAreWhatTheModelAllocates) {
  // CPU profile: activations + workspace of each stage = GPT's own count, for 1F1B and AFAB.
  const HardwareProfile cpu = builtin_profile("cpu");
  for (int64_t pp : {1, 2, 3}) {
    for (bool afab : {false, true}) {
      PlanInput in = small(3, 4, 32, 100, 16, 2);
      in.layout = PlanLayout{1, pp, 1, 1, 0, 4, afab};
      const Plan p = make_plan(in, cpu);
      ASSERT_EQ(p.stage_memory.size(), size_t(pp));
      for (int64_t s = 0; s < pp; ++s) {
        const int slots = pp == 1 ? 1 : (afab ? 4 : int(std::min<int64_t>(pp - s, 4)));
        const GPTConfig g = make_gpt_config(3, 4, 32, 100, 16);
        GPT<float> model(g, 2, 16, ModelShard{1, 0, int(pp), int(s)}, nullptr, slots);
        const MemoryBreakdown& m = p.stage_memory[size_t(s)];
        EXPECT_DOUBLE_EQ(m.activations + m.workspace, double(model.activation_bytes()))
            << "pp " << pp << " stage " << s << (afab ? " afab" : " 1f1b");
        EXPECT_DOUBLE_EQ(m.params, double(model.param_bytes())) << "pp " << pp << " stage " << s;
        EXPECT_DOUBLE_EQ(m.grads, m.params);
        EXPECT_DOUBLE_EQ(m.optimizer, 2 * m.params);  // AdamW m and v, fp32, ZeRO-0
      }
    }
  }
}

TEST(Plan, ZeroShardsTheMomentsAndDataParallelMovesTheRingVolume) {
  PlanInput in = small(2, 2, 64, 100, 32, 2);
  in.layout = PlanLayout{1, 1, 1, 4, 1, 1};
  const Plan p = make_plan(in, builtin_profile("cpu"));
  const double P = double(count_params(in.model, in.layout).per_stage[0]);
  EXPECT_DOUBLE_EQ(p.peak.optimizer, 8 * std::ceil(P / 4));
  EXPECT_DOUBLE_EQ(p.peak.comm, 4 * std::ceil(P / 4));  // the reduce-scatter's shard
  EXPECT_DOUBLE_EQ(p.comm.dp, 2.0 * 3 / 4 * 4 * P);     // 2(n−1)/n × gradient bytes
  EXPECT_EQ(p.comm.tp, 0);
  EXPECT_EQ(p.comm.pp, 0);
}

// On the CPU a save's whole tensors take the devices' memory: a config whose peak fits but whose
// save does not trained until its first save and ran out of memory there.
TEST(Plan, OnTheCpuACheckpointSaveMustFitToo) {
  PlanInput in = small(2, 2, 64, 100, 32, 2);
  in.layout = PlanLayout{1, 1, 1, 2, 1, 1};
  HardwareProfile cpu = builtin_profile("cpu");  // 2 ranks a host
  const Plan p = make_plan(in, cpu);
  const double P = double(p.params.padded), local = double(p.params.per_stage[0]);
  EXPECT_DOUBLE_EQ(p.save_share_bytes, p.peak.total() + 8 * local + 16 * P / 2);
  EXPECT_TRUE(p.fits);
  cpu.mem_capacity = 0.5 * (p.peak.total() + p.save_share_bytes);  // the peak fits, a save not
  const Plan tight = make_plan(in, cpu);
  EXPECT_FALSE(tight.fits);
  EXPECT_NE(tight.why_not.find("a checkpoint save needs"), std::string::npos) << tight.why_not;
  in.saves_checkpoints = false;  // checkpoint.interval = 0 and checkpoint.final = false
  const Plan no_saves = make_plan(in, cpu);
  EXPECT_EQ(no_saves.save_share_bytes, 0);
  EXPECT_TRUE(no_saves.fits);
  in.saves_checkpoints = true;  // on a GPU the save's tensors are in host memory
  HardwareProfile gpu = builtin_profile("h100");
  gpu.mem_capacity = cpu.mem_capacity;
  EXPECT_EQ(make_plan(in, gpu).save_share_bytes, 0);
}

// A GPU profile without an fp32 rate planned fp32 GEMMs at its tensor-core peak.
TEST(Plan, AnFp32PlanOnAGpuNeedsTheProfilesFp32Rate) {
  PlanInput in = small(2, 2, 64, 100, 32, 2);
  HardwareProfile gpu = builtin_profile("h100");
  gpu.fp32_flops = 0;
  in.bf16 = true;
  EXPECT_NO_THROW(make_plan(in, gpu));                // head size 32: the tiled tensor-core kernels
  PlanInput odd_heads = small(2, 2, 72, 100, 32, 2);  // head size 36: the fp32 kernels
  odd_heads.bf16 = true;
  test::expect_error([&] { make_plan(odd_heads, gpu); }, {"has no 'fp32_flops'", "not 36"});
  in.bf16 = false;
  test::expect_error([&] { make_plan(in, gpu); }, {"has no 'fp32_flops'", "run.precision=bf16"});
  EXPECT_NO_THROW(make_plan(in, builtin_profile("cpu")));  // a CPU has one peak
}

TEST(Plan, TheBuiltInCpuProfileRatesRingAttentionBelowTheGemms) {
  // The ring's block kernel runs at a few GFLOP/s where the GEMMs reach tens: at the GEMMs' rate
  // cp 2 ranked beside dp 2, and a cp 2 step measured 2.35 s was planned at 0.38 s.
  PlanInput in = small(8, 4, 256, 257, 512, 8);
  in.layout = PlanLayout{1, 1, 1, 2, 1, 1};
  const double dp2 = make_plan(in, builtin_profile("cpu")).step.total();
  in.micro_batch_size = 16;
  in.layout = PlanLayout{1, 1, 2, 1, 1, 1};
  const double cp2 = make_plan(in, builtin_profile("cpu")).step.total();
  EXPECT_GT(cp2, 3 * dp2) << "cp2 " << cp2 << " s, dp2 " << dp2 << " s";
}

TEST(Plan, TheBubbleIsThePipelineTheory) {
  // Equal stages: bubble / (compute + tp + cp + bubble) = (pp − 1)/(M + pp − 1).
  for (int64_t pp : {2, 4}) {
    for (int64_t M : {1, 4, 8}) {
      PlanInput in = small(8, 4, 64, 100, 32, 2);
      in.layout = PlanLayout{1, pp, 1, 1, 0, M};
      const Plan p = make_plan(in, builtin_profile("h100"));
      const double pipe = p.step.compute + p.step.tp_comm + p.step.cp_comm + p.step.bubble;
      EXPECT_NEAR(p.step.bubble / pipe, double(pp - 1) / double(M + pp - 1), 1e-12)
          << "pp " << pp << " M " << M;
      EXPECT_DOUBLE_EQ(p.comm.pp, 2.0 * double(M) * 4 * 2 * 32 * 64);  // fp32 (N, C) each way
    }
  }
}

TEST(Plan, GpuProfilesModelBerthsCudaBackendInEitherPrecision) {
  // GPT-2 124M, 8 x 1024 tokens on one H100: berth keeps fp32 weights, gradients, moments and
  // activations in both precisions; fp32 GEMMs run at the fp32 peak (TF32 off), bf16 GEMMs at the
  // bf16 peak, and bf16 adds the rounded operands' scratch.
  PlanInput in = small(12, 12, 768, 50257, 1024, 8);
  in.layout = PlanLayout{1, 1, 1, 1, 0, 1};
  const HardwareProfile h100 = builtin_profile("h100");
  const Plan fp32 = make_plan(in, h100);
  in.bf16 = true;
  const Plan bf16 = make_plan(in, h100);
  const double P = double(fp32.params.padded);
  EXPECT_DOUBLE_EQ(fp32.peak.params, 4 * P);
  EXPECT_DOUBLE_EQ(fp32.peak.grads, 4 * P);
  EXPECT_DOUBLE_EQ(fp32.peak.optimizer, 8 * P);
  EXPECT_DOUBLE_EQ(bf16.peak.params, fp32.peak.params);
  EXPECT_DOUBLE_EQ(bf16.peak.activations, fp32.peak.activations);
  // the largest operands: the MLP's (N, 4C) input, the LM head's (Vp, C) weight, its (N, Vp)
  // output gradient, at 2 bytes
  const double N = 8 * 1024, C = 768, Vp = 50304;
  EXPECT_DOUBLE_EQ(bf16.peak.workspace - fp32.peak.workspace, 2 * (N * 4 * C + Vp * C + N * Vp));
  EXPECT_LT(bf16.step.compute, fp32.step.compute / 3) << "tensor cores vs fp32 GEMMs";
  EXPECT_GT(bf16.tokens_per_s, fp32.tokens_per_s);
  const std::string text = format_plan(fp32, 0);
  EXPECT_NE(text.find("precision: fp32 GEMMs (no tensor cores: TF32 off)"), std::string::npos)
      << text;
  EXPECT_NE(format_plan(bf16, 0).find("precision: bf16 GEMMs and attention (tensor cores)"),
            std::string::npos);
  // attention: bf16 runs the tensor-core kernels for head sizes 32, 64, 80, 96 and 128 only; 16
  // heads of 48 (the same FLOPs) stay on the fp32 kernels, and in fp32 the head size changes
  // nothing
  PlanInput hs48 = small(12, 16, 768, 50257, 1024, 8);
  hs48.layout = in.layout, hs48.bf16 = true;
  const Plan bf16_hs48 = make_plan(hs48, h100);
  EXPECT_LT(bf16.step.compute, bf16_hs48.step.compute);
  EXPECT_NE(format_plan(bf16_hs48, 0).find("precision: bf16 GEMMs (tensor cores)"),
            std::string::npos);
  hs48.bf16 = false;
  EXPECT_NEAR(make_plan(hs48, h100).step.compute, fp32.step.compute, 1e-9 * fp32.step.compute);
  PlanInput hs80 = small(12, 12, 960, 50257, 1024, 8);  // GPT-3 2.7B's head size
  hs80.layout = in.layout, hs80.bf16 = true;
  EXPECT_NE(format_plan(make_plan(hs80, h100), 0)
                .find("precision: bf16 GEMMs and attention (tensor cores)"),
            std::string::npos);
}

// The search takes every factorization of the devices (it took powers of two only, so 12
// devices had no tp 3 or pp 3 layout), and a layout where no micro-batch split fits shows the
// split that needs least memory (it showed the first tried, 15 times more than the least).
TEST(Plan, LayoutsFactorTheDevicesAndARejectionShowsItsLeastMemory) {
  PlanInput in = small(12, 12, 768, 50257, 1024, 4);
  in.layout = PlanLayout{1, 1, 1, 12, 0, 1};  // 48 rows
  const std::vector<LayoutChoice> ranked = rank_layouts(in, builtin_profile("h100"), 12);
  auto has = [&](int64_t tp, int64_t pp, int64_t cp) {
    return std::any_of(ranked.begin(), ranked.end(), [&](const LayoutChoice& c) {
      return c.layout.tp == tp && c.layout.pp == pp && c.layout.cp == cp;
    });
  };
  EXPECT_TRUE(has(3, 1, 1));
  EXPECT_TRUE(has(1, 3, 1));
  EXPECT_TRUE(has(2, 6, 1));
  EXPECT_TRUE(has(1, 1, 3) == false) << "seq_len 1024 is not divisible by 2·3";
  for (const LayoutChoice& c : ranked) {
    EXPECT_EQ(12 % (c.layout.tp * c.layout.pp * c.layout.cp), 0);
    EXPECT_EQ(c.layout.dp * c.layout.microbatches * c.micro_batch_size, 48);
  }
  HardwareProfile small_gpu = builtin_profile("h100");
  small_gpu.mem_capacity = 1 << 20;  // nothing fits
  for (const LayoutChoice& c : rank_layouts(in, small_gpu, 12)) {
    ASSERT_FALSE(c.plan.fits);
    const int64_t per_dp = 48 / c.layout.dp;
    for (int64_t micro = 1; micro <= per_dp; ++micro) {
      if (per_dp % micro != 0 || (c.layout.pp > 1 && micro < c.layout.pp)) continue;
      PlanInput x = in;
      x.layout = c.layout;
      x.layout.microbatches = micro;
      x.micro_batch_size = per_dp / micro;
      EXPECT_GE(make_plan(x, small_gpu).peak.total(), c.plan.peak.total())
          << "tp " << c.layout.tp << " pp " << c.layout.pp << " micro " << micro;
    }
  }
}

TEST(Plan, LayoutsAreRankedAndRejectionsSayWhy) {
  // GPT-2 124M, global batch 64 × 1024 on 8 H100s.
  PlanInput in = small(12, 12, 768, 50257, 1024, 8);
  in.layout = PlanLayout{1, 1, 1, 8, 0, 1};
  const std::vector<LayoutChoice> ranked = rank_layouts(in, builtin_profile("h100"), 8);
  ASSERT_FALSE(ranked.empty());
  EXPECT_TRUE(ranked.front().plan.fits);
  for (size_t i = 1; i < ranked.size(); ++i) {
    if (ranked[i].plan.fits && ranked[i - 1].plan.fits) {
      EXPECT_GE(ranked[i - 1].plan.tokens_per_s, ranked[i].plan.tokens_per_s);
    }
  }
  for (const LayoutChoice& c : ranked) {
    EXPECT_EQ(c.layout.world(), 8);
    EXPECT_EQ(c.layout.dp * c.layout.microbatches * c.micro_batch_size, 64) << "global batch kept";
    EXPECT_EQ(in.model.NH % c.layout.tp, 0);
  }
  // Packed rows aligned to 2 tokens: cp 2 splits a row in 4 chunks, so a document of 2 slots
  // would straddle two ranks (berth train refuses it); no cp layout is offered, and one asked
  // for says why.
  PlanInput aligned = in;
  aligned.pack_align = 2;
  bool any_cp = false;
  for (const LayoutChoice& c : rank_layouts(aligned, builtin_profile("h100"), 8)) {
    any_cp = any_cp || c.layout.cp > 1;
  }
  EXPECT_FALSE(any_cp);
  aligned.layout = PlanLayout{1, 1, 2, 4, 0, 1};
  EXPECT_EQ(layout_invalid_reason(aligned), "data.pack_align (2) is not a multiple of 2·cp (4)");
  aligned.pack_align = 4;
  EXPECT_EQ(layout_invalid_reason(aligned), "");
  // Rows two-thirds filled with document tokens (padded data): the step takes as long, and
  // tokens/s and MFU count the documents' tokens, as berth train does.
  PlanInput padded = in;
  padded.token_fill = 2.0 / 3.0;
  const Plan full = make_plan(in, builtin_profile("h100"));
  const Plan part = make_plan(padded, builtin_profile("h100"));
  EXPECT_DOUBLE_EQ(part.step.total(), full.step.total());
  EXPECT_DOUBLE_EQ(part.tokens_per_step, full.tokens_per_step * 2.0 / 3.0);
  EXPECT_NEAR(part.tokens_per_s, full.tokens_per_s * 2.0 / 3.0, 1e-9 * full.tokens_per_s);
  EXPECT_NEAR(part.mfu, full.mfu * 2.0 / 3.0, 1e-12);
  EXPECT_NE(
      format_plan(part, 0).find("(43690 tokens of documents in 65536 row slots, 66.7 % filled)"),
      std::string::npos)
      << format_plan(part, 0);
  // An evaluation needing more rows of data.val than it holds (eval.batches × dp × micro-batch):
  // the layout does not fit, as berth train refuses it, and the ranking offers those that do.
  PlanInput eval = in;  // dp 8 × micro-batches of 8 rows
  eval.eval_batches = 2;
  eval.val_rows_by_cp = {{1, 100}, {2, 100}, {4, 100}, {8, 100}};
  const Plan e = make_plan(eval, builtin_profile("h100"));
  EXPECT_FALSE(e.fits);
  EXPECT_EQ(e.why_not,
            "an evaluation reads eval.batches 2 × dp 8 × micro_batch_size 8 = 128 rows of "
            "data.val, which holds 100 (berth train refuses it: lower eval.batches to at most 1)");
  // Fewer rows than one global batch: eval.batches cannot help.
  eval.val_rows_by_cp = {{1, 50}};
  EXPECT_NE(make_plan(eval, builtin_profile("h100"))
                .why_not.find("which holds 50 (berth train refuses it: fewer than one global batch "
                              "of 64; give a bigger data.val, or lower train.micro_batch_size)"),
            std::string::npos);
  eval.val_rows_by_cp = {{1, 100}, {2, 100}, {4, 100}, {8, 100}};
  int fitting = 0;
  for (const LayoutChoice& c : rank_layouts(eval, builtin_profile("h100"), 8)) {
    if (!c.plan.fits) continue;
    ++fitting;
    EXPECT_LE(2 * c.layout.dp * c.micro_batch_size, 100) << c.plan.why_not;
  }
  EXPECT_GT(fitting, 0);
  // A 1-device plan of a model too large for it says so and names the stage and sizes.
  PlanInput big = small(48, 64, 8192, 50257, 2048, 1);
  const Plan p = make_plan(big, builtin_profile("h100"));
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why_not.find("more than the 80.0 GiB of a device"), std::string::npos) << p.why_not;
  EXPECT_EQ(smallest_fitting_devices(in, builtin_profile("h100")), 1);
  const int64_t n = smallest_fitting_devices(big, builtin_profile("h100"));
  EXPECT_GT(n, 1);
  const std::vector<LayoutChoice> at_n = rank_layouts(big, builtin_profile("h100"), n);
  EXPECT_TRUE(std::any_of(at_n.begin(), at_n.end(), [](const LayoutChoice& c) { return c.plan.fits; }));
  const std::vector<LayoutChoice> below = rank_layouts(big, builtin_profile("h100"), n / 2);
  EXPECT_TRUE(std::none_of(below.begin(), below.end(), [](const LayoutChoice& c) { return c.plan.fits; }));
  test::expect_error([] { builtin_profile("v100"); }, {"unknown hardware profile 'v100'"});
}

TEST(Plan, ProfileFilesRoundTripAndBadOnesAreNamed) {
  const std::string dir = ::testing::TempDir() + "berth_plan_profile";
  std::filesystem::create_directories(dir);
  HardwareProfile h = builtin_profile("cpu");
  h.name = "host";
  h.gemm_rates = {{64, 20e9}, {512, 90e9}};
  const std::string path = dir + "/p.json";
  std::ofstream(path) << hardware_profile_json(h);
  const HardwareProfile r = read_hardware_profile(path);
  EXPECT_EQ(r.name, "host");
  EXPECT_TRUE(r.cpu);
  ASSERT_EQ(r.gemm_rates.size(), 2u);
  EXPECT_DOUBLE_EQ(r.gemm_rates[1].second, 90e9);
  EXPECT_DOUBLE_EQ(r.mem_bandwidth, h.mem_bandwidth);
  // A file too large to be a profile (a dataset given as --gpu) is refused unread.
  std::ofstream(dir + "/big.json") << std::string((size_t(1) << 20) + 1, ' ');
  test::expect_error([&] { read_hardware_profile(dir + "/big.json"); },
                     {"is 1048577 bytes, not a hardware profile"});
  std::ofstream(dir + "/bad.json") << "{\"format\": \"berth-hardware-profile\", \"peak_flops\": -1}";
  test::expect_error([&] { read_hardware_profile(dir + "/bad.json"); },
                     {"'peak_flops' is -1, outside [1000000, 1e+18]"});
  std::ofstream(dir + "/other.json") << "{\"a\": 1}";
  test::expect_error([&] { read_hardware_profile(dir + "/other.json"); },
                     {"is not a hardware profile"});
  // Figures no hardware has printed NaN and infinite step times (and reserve --config booked a
  // minute); wrong types were an "internal error" naming no key.
  auto bad = [&](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(hardware_profile_json(h));
    j[key] = nlohmann::json::parse(value);
    std::ofstream(dir + "/edited.json") << j.dump();
    return [&dir] { read_hardware_profile(dir + "/edited.json"); };
  };
  test::expect_error(bad("peak_flops", "1e-300"), {"'peak_flops' is 1e-300, outside"});
  test::expect_error(bad("latency_s", "1e300"), {"'latency_s' is 1e+300, outside [0, 10]"});
  test::expect_error(bad("matmul_efficiency", "50"), {"'matmul_efficiency' is 50, outside"});
  test::expect_error(bad("devices_per_node", "0.5"), {"'devices_per_node' is 0.5, outside"});
  test::expect_error(bad("devices_per_node", "2.5"), {"'devices_per_node' must be a whole"});
  test::expect_error(bad("cpu", "\"yes\""), {"'cpu' must be true or false, got \"yes\""});
  test::expect_error(bad("name", "5"), {"'name' must be a string, got 5"});
  test::expect_error(bad("gemm_rates", "[[64, 1e-300]]"), {"every 'gemm_rates' entry"});
  // rates that may be unknown: 0, or a real rate (fp32_flops 1e-300 printed NaN step times)
  test::expect_error(bad("fp32_flops", "1e-300"),
                     {"'fp32_flops' is 1e-300: 0 (not known) or at least 1000000"});
  test::expect_error(bad("block_attention_rate", "1"), {"'block_attention_rate' is 1: 0"});
  bad("fp32_flops", "0")();
  // only a profile may be replaced by --calibrate
  EXPECT_TRUE(is_hardware_profile_file(path));
  EXPECT_FALSE(is_hardware_profile_file(dir + "/other.json"));
  EXPECT_FALSE(is_hardware_profile_file(dir + "/missing.json"));
  EXPECT_FALSE(is_hardware_profile_file(dir));
  std::ofstream(dir + "/nan.json") << "{\"format\": NaN}";
  test::expect_error([&] { read_hardware_profile(dir + "/nan.json"); }, {"is not valid JSON"});
  EXPECT_FALSE(is_hardware_profile_file(dir + "/nan.json"));
  std::filesystem::remove_all(dir);
}

TEST(Plan, TensorCoreAttentionOnlyWhereTheProfilesSharedMemoryTakesItsBlocks) {
  // A hand-written profile of a GPU with 99 KiB of shared memory per block (compute capability
  // 8.6 / 8.9, e.g. an L40S), read back from its file: the tiled attention's blocks need 94 KiB
  // at head size 64 and 150 KiB at 128 (tiled_attention_shared_bytes), so only 64 runs on tensor
  // cores there, as the CUDA backend decides from the device's limit.
  const std::string dir = ::testing::TempDir() + "berth_plan_smem";
  std::filesystem::create_directories(dir);
  HardwareProfile l40s = builtin_profile("h100");
  l40s.name = "l40s", l40s.source = "hand-written";
  l40s.block_shared_bytes = 99 * 1024;
  const std::string path = dir + "/l40s.json";
  std::ofstream(path) << hardware_profile_json(l40s);
  const HardwareProfile read = read_hardware_profile(path);
  EXPECT_DOUBLE_EQ(read.block_shared_bytes, 99 * 1024);
  std::filesystem::remove_all(dir);
  EXPECT_DOUBLE_EQ(builtin_profile("a100").block_shared_bytes, 163 * 1024);

  PlanInput hs128 = small(12, 6, 768, 50257, 1024, 8);  // 6 heads of 128
  hs128.layout = PlanLayout{1, 1, 1, 1, 0, 1}, hs128.bf16 = true;
  const Plan on_h100 = make_plan(hs128, builtin_profile("h100"));
  const Plan on_a100 = make_plan(hs128, builtin_profile("a100"));  // 163 KiB: fits
  const Plan on_l40s = make_plan(hs128, read);
  EXPECT_NE(format_plan(on_a100, 0).find("bf16 GEMMs and attention (tensor cores)"),
            std::string::npos);
  const std::string text = format_plan(on_l40s, 0);
  EXPECT_NE(text.find("precision: bf16 GEMMs (tensor cores)"), std::string::npos) << text;
  EXPECT_NE(text.find("attention in fp32 without tensor cores: head size 128 needs 150 KiB of "
                      "shared memory per block, l40s has 99 KiB"),
            std::string::npos)
      << text;
  EXPECT_GT(on_l40s.step.compute, on_h100.step.compute) << "the fp32 attention kernels";
  const std::string json = plan_to_json(on_l40s, 0, {}, 1);
  EXPECT_NE(json.find("\"tensor_cores\": false"), std::string::npos) << json;
  EXPECT_NE(json.find("needs 150 KiB of shared memory per block"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(json)["smallest_devices"], 1);
  // no count that fits: null, not 0 (a count)
  EXPECT_TRUE(nlohmann::json::parse(plan_to_json(on_l40s, 0, {}, 0))["smallest_devices"].is_null());
  PlanInput hs64 = small(12, 12, 768, 50257, 1024, 8);
  hs64.layout = hs128.layout, hs64.bf16 = true;
  EXPECT_NE(format_plan(make_plan(hs64, read), 0).find("bf16 GEMMs and attention (tensor cores)"),
            std::string::npos);
  // a profile without the figure (an older file) is taken to have enough
  l40s.block_shared_bytes = 0;
  EXPECT_DOUBLE_EQ(make_plan(hs128, l40s).step.compute, on_h100.step.compute);
}

}  // namespace
}  // namespace berth
