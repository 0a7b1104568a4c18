// Tests for runtime/config: parsing, type checks, overrides, validation, config_to_toml round trip.
#include "runtime/config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/check.h"

namespace berth {
namespace {

// ---- helpers -------------------------------------------------------------------------------

// The berth::Error message thrown by `fn`; fails the test (and returns "") when nothing is thrown.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected berth::Error, nothing was thrown";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)                                                   \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                          \
      << "message: " << (haystack) << "\nexpected to contain: " << (needle)

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(text, "configs/x.toml", overrides); });
}

class TempDir {
 public:
  TempDir() {
    const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
    path_ = std::filesystem::path(testing::TempDir()) /
            fmt::format("berth_test_config_{}_{}", static_cast<long>(getpid()),
                        unit.current_test_info()->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (path_ / name).string();
    std::ofstream out(p, std::ios::binary);
    out << text;
    return p;
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void expect_same(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(a.run.name, b.run.name);
  EXPECT_EQ(a.run.out_dir, b.run.out_dir);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.device, b.run.device);
  EXPECT_EQ(a.run.precision, b.run.precision);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.d_model, b.model.d_model);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.val, b.data.val);
  EXPECT_EQ(a.data.mode, b.data.mode);
  EXPECT_EQ(a.data.seq_len, b.data.seq_len);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.train.micro_batch_size, b.train.micro_batch_size);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.lr, b.train.lr);  // exact: doubles must round-trip bit for bit
  EXPECT_EQ(a.train.lr_schedule, b.train.lr_schedule);
  EXPECT_EQ(a.train.warmup_steps, b.train.warmup_steps);
  EXPECT_EQ(a.train.min_lr, b.train.min_lr);
  EXPECT_EQ(a.train.beta1, b.train.beta1);
  EXPECT_EQ(a.train.beta2, b.train.beta2);
  EXPECT_EQ(a.train.eps, b.train.eps);
  EXPECT_EQ(a.train.weight_decay, b.train.weight_decay);
  EXPECT_EQ(a.train.grad_clip, b.train.grad_clip);
  EXPECT_EQ(a.train.log_interval, b.train.log_interval);
  EXPECT_EQ(a.eval.interval, b.eval.interval);
  EXPECT_EQ(a.eval.batches, b.eval.batches);
  // and every key of every section (config_differences walks the one list of keys)
  const std::vector<std::string> d = config_differences(a, b);
  EXPECT_TRUE(d.empty()) << fmt::format("{}", fmt::join(d, "; "));
}

const char* kFullFile = R"(
# a complete config
[run]
name = "gpt2-small"
out_dir = "/tmp/runs"
seed = 42

[model]
n_layer = 12
n_head = 12
d_model = 768
vocab_size = 50257
max_seq_len = 1024

[data]
train = "data/train.h5"
val = "data/val.h5"
mode = "stream"
seq_len = 512
shuffle = true

[train]
micro_batch_size = 8
steps = 5000
lr = 6e-4
lr_schedule = "constant"
warmup_steps = 100
min_lr = 6e-5
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
weight_decay = 0
grad_clip = 0.5
log_interval = 10

[eval]
interval = 250
batches = 20
)";

// ---- parsing -------------------------------------------------------------------------------

TEST(Config, EmptyTextGivesDefaults) {
  const RunConfig cfg = parse_config("", "empty.toml");
  expect_same(cfg, RunConfig{});
  EXPECT_EQ(cfg.source, "empty.toml");
  EXPECT_EQ(cfg.train.lr, 3e-4);
  EXPECT_EQ(cfg.model.d_model, 256);
  EXPECT_EQ(cfg.data.mode, "stream");
}

TEST(Config, FullFile) {
  const RunConfig cfg = parse_config(kFullFile, "configs/full.toml");
  EXPECT_EQ(cfg.run.name, "gpt2-small");
  EXPECT_EQ(cfg.run.out_dir, "/tmp/runs");
  EXPECT_EQ(cfg.run.seed, 42);
  EXPECT_EQ(cfg.model.n_layer, 12);
  EXPECT_EQ(cfg.model.n_head, 12);
  EXPECT_EQ(cfg.model.d_model, 768);
  EXPECT_EQ(cfg.model.vocab_size, 50257);
  EXPECT_EQ(cfg.model.max_seq_len, 1024);
  EXPECT_EQ(cfg.data.train, "data/train.h5");
  EXPECT_EQ(cfg.data.val, "data/val.h5");
  EXPECT_EQ(cfg.data.mode, "stream");
  EXPECT_EQ(cfg.data.seq_len, 512);
  EXPECT_TRUE(cfg.data.shuffle);
  EXPECT_EQ(cfg.train.micro_batch_size, 8);
  EXPECT_EQ(cfg.train.steps, 5000);
  EXPECT_EQ(cfg.train.lr, 6e-4);
  EXPECT_EQ(cfg.train.lr_schedule, "constant");
  EXPECT_EQ(cfg.train.warmup_steps, 100);
  EXPECT_EQ(cfg.train.min_lr, 6e-5);
  EXPECT_EQ(cfg.train.beta1, 0.8);
  EXPECT_EQ(cfg.train.beta2, 0.99);
  EXPECT_EQ(cfg.train.eps, 1e-6);
  EXPECT_EQ(cfg.train.weight_decay, 0.0);  // integer accepted for a float key
  EXPECT_EQ(cfg.train.grad_clip, 0.5);
  EXPECT_EQ(cfg.train.log_interval, 10);
  EXPECT_EQ(cfg.eval.interval, 250);
  EXPECT_EQ(cfg.eval.batches, 20);
}

TEST(Config, DottedKeysAndInlineTables) {
  const RunConfig cfg = parse_config("train.steps = 7\nmodel = { n_layer = 2 }\n", "x.toml");
  EXPECT_EQ(cfg.train.steps, 7);
  EXPECT_EQ(cfg.model.n_layer, 2);
}

TEST(Config, UnknownKeyNamesKeyFileAndKnownKeys) {
  const std::string msg = parse_error("[train]\nlrr = 0.1\n");
  EXPECT_CONTAINS(msg, "configs/x.toml");
  EXPECT_CONTAINS(msg, "unknown key 'train.lrr'");
  EXPECT_CONTAINS(msg, "known keys of [train]: micro_batch_size, steps, lr,");
  EXPECT_CONTAINS(msg, "line 2");
}

TEST(Config, UnknownSection) {
  const std::string msg = parse_error("[optim]\nlr = 0.1\n");
  EXPECT_CONTAINS(msg, "configs/x.toml");
  EXPECT_CONTAINS(msg, "unknown section [optim]");
  EXPECT_CONTAINS(msg, "[train]");
}

TEST(Config, TopLevelValueIsAnError) {
  const std::string msg = parse_error("steps = 10\n");
  EXPECT_CONTAINS(msg, "configs/x.toml");
  EXPECT_CONTAINS(msg, "'steps'");
  EXPECT_CONTAINS(msg, "not a section");
}

TEST(Config, WrongTypes) {
  std::string msg = parse_error("[train]\nlr = \"fast\"\n");
  EXPECT_CONTAINS(msg, "configs/x.toml: train.lr must be a number, got string");
  EXPECT_CONTAINS(msg, "\"fast\"");

  msg = parse_error("[train]\nsteps = 10.0\n");
  EXPECT_CONTAINS(msg, "configs/x.toml: train.steps must be an integer, got float");

  msg = parse_error("[data]\nshuffle = 1\n");
  EXPECT_CONTAINS(msg, "data.shuffle must be a boolean");
  EXPECT_CONTAINS(msg, "got integer");

  msg = parse_error("[run]\nname = 5\n");
  EXPECT_CONTAINS(msg, "run.name must be a string");

  msg = parse_error("[model]\nn_layer = [1, 2]\n");
  EXPECT_CONTAINS(msg, "model.n_layer must be an integer, got array");
}

TEST(Config, MissingFile) {
  TempDir dir;
  const std::string path = dir.path("nope.toml");
  const std::string msg = error_of([&] { load_config(path); });
  EXPECT_CONTAINS(msg, "config file '" + path + "' not found");
}

TEST(Config, LoadFromFileWithOverrides) {
  TempDir dir;
  const std::string path = dir.write("ok.toml", kFullFile);
  const RunConfig cfg = load_config(path, {"train.steps=9"});
  EXPECT_EQ(cfg.source, path);
  EXPECT_EQ(cfg.model.d_model, 768);
  EXPECT_EQ(cfg.train.steps, 9);
}

TEST(Config, SyntaxErrorMentionsFileLineAndColumn) {
  TempDir dir;
  const std::string path = dir.write("bad.toml", "[train]\nsteps = 10\nlr = = 3\n");
  const std::string msg = error_of([&] { load_config(path); });
  EXPECT_CONTAINS(msg, path + ":3:");
  EXPECT_CONTAINS(msg, "TOML syntax error");
}

// ---- overrides -----------------------------------------------------------------------------

TEST(Config, OverridesApplyAfterFile) {
  const RunConfig cfg = parse_config("[train]\nlr = 0.1\nsteps = 5\n", "x.toml",
                                     {"train.lr=3e-4", "run.name=foo", "data.shuffle=true",
                                      "train.steps = 12", "train.grad_clip=2",
                                      "run.out_dir=\"with space\"", "data.val=/data/v.h5"});
  EXPECT_EQ(cfg.train.lr, 3e-4);
  EXPECT_EQ(cfg.run.name, "foo");
  EXPECT_TRUE(cfg.data.shuffle);
  EXPECT_EQ(cfg.train.steps, 12);
  EXPECT_EQ(cfg.train.grad_clip, 2.0);
  EXPECT_EQ(cfg.run.out_dir, "with space");
  EXPECT_EQ(cfg.data.val, "/data/v.h5");
}

TEST(Config, OverrideLaterWins) {
  const RunConfig cfg = parse_config("", "x.toml", {"train.steps=3", "train.steps=4"});
  EXPECT_EQ(cfg.train.steps, 4);
}

TEST(Config, OverrideOfStringKeyKeepsTextOfNumber) {
  const RunConfig cfg = parse_config("", "x.toml", {"run.name=2024", "data.val="});
  EXPECT_EQ(cfg.run.name, "2024");
  EXPECT_EQ(cfg.data.val, "");
}

TEST(Config, OverrideUnknownKey) {
  std::string msg = parse_error("", {"train.lrr=1"});
  EXPECT_CONTAINS(msg, "override 'train.lrr=1'");
  EXPECT_CONTAINS(msg, "unknown key 'train.lrr'");
  // A key of another section (micro_batch_size is in [train], microbatches in [parallel]).
  msg = parse_error("", {"train.microbatches=2"});
  EXPECT_CONTAINS(msg, "unknown key 'train.microbatches'; did you mean parallel.microbatches?");
  EXPECT_CONTAINS(msg, "known keys of [train]: ");
  msg = parse_error("[data]\nlr = 1\n", {});
  EXPECT_CONTAINS(msg, "unknown key 'data.lr' (line 2); did you mean train.lr?");
  msg = parse_error("", {"optim.lr=1"});
  EXPECT_CONTAINS(msg, "override 'optim.lr=1'");
  EXPECT_CONTAINS(msg, "unknown section [optim]");
}

TEST(Config, OverrideMalformed) {
  for (const char* bad : {"train.lr", "lr=1", "=1", "train.=1", ".lr=1"}) {
    const std::string msg = parse_error("", {bad});
    EXPECT_CONTAINS(msg, std::string("override '") + bad + "'");
    EXPECT_CONTAINS(msg, "section.key=value");
  }
}

TEST(Config, OverrideWrongType) {
  std::string msg = parse_error("", {"train.lr=fast"});
  EXPECT_CONTAINS(msg, "override 'train.lr=fast'");
  EXPECT_CONTAINS(msg, "train.lr must be a number, got string");
  msg = parse_error("", {"train.steps=1e3"});
  EXPECT_CONTAINS(msg, "train.steps must be an integer, got float");
  msg = parse_error("", {"data.shuffle=yes"});
  EXPECT_CONTAINS(msg, "data.shuffle must be a boolean");
}

TEST(Config, OverrideIsValidated) {
  const std::string msg = parse_error("", {"train.steps=0"});
  EXPECT_CONTAINS(msg, "train.steps must be > 0, got 0");
}

// A check that fails on a value an override set names the override, not only the config file
// (where the value is not): the last override of a key, and no key the message does not name.
TEST(Config, ValidationNamesTheOverrideThatSetTheValue) {
  std::string msg = parse_error("[train]\nsteps = 50\n", {"train.steps=7", "model.n_layer=4000000",
                                                          "train.steps=9", "train.lr=1e-3"});
  EXPECT_CONTAINS(msg, "configs/x.toml: model.n_layer = 4000000 is beyond");
  EXPECT_CONTAINS(msg, "(set by the override 'model.n_layer=4000000')");
  EXPECT_EQ(msg.find("train.steps="), std::string::npos) << msg;
  EXPECT_EQ(msg.find("train.lr="), std::string::npos) << msg;
  msg = parse_error("[data]\nseq_len = 64\n", {"model.max_seq_len = 32"});
  EXPECT_CONTAINS(msg, "data.seq_len (64) > model.max_seq_len (32)");
  EXPECT_CONTAINS(msg, "(set by the override 'model.max_seq_len = 32')");
  // A key that only begins like an overridden one ("train.lr" in "train.lr_schedule") is not it.
  msg = parse_error("[train]\nlr_schedule = \"linear\"\n", {"train.lr=1e-3"});
  EXPECT_CONTAINS(msg, "train.lr_schedule \"linear\"");
  EXPECT_EQ(msg.find("set by the override"), std::string::npos) << msg;
  // A key the advice names is not the one that failed.
  msg = parse_error("", {"data.mode=packed", "data.pack_algorithm=padded"});
  EXPECT_CONTAINS(msg,
                  "is data.mode = \"padded\") (set by the override "
                  "'data.pack_algorithm=padded')");
  EXPECT_EQ(msg.find("data.mode=packed"), std::string::npos) << msg;
  // A value from the file alone says nothing of overrides.
  msg = parse_error("[train]\nsteps = 0\n");
  EXPECT_EQ(msg.find("override"), std::string::npos) << msg;
}

// A number TOML cannot represent is refused as such, not read as a string ("got string").
TEST(Config, OverrideOfANumberBeyond64BitsSaysSo) {
  const std::string msg = parse_error("", {"model.n_layer=99999999999999999999"});
  EXPECT_CONTAINS(msg, "override 'model.n_layer=99999999999999999999'");
  EXPECT_CONTAINS(msg, "'99999999999999999999' is not a value model.n_layer can take");
  EXPECT_EQ(msg.find("got string"), std::string::npos) << msg;
}

// ---- validation ----------------------------------------------------------------------------

TEST(Config, ValidationSeqLenAboveMax) {
  const std::string msg = parse_error("[data]\nseq_len = 512\n[model]\nmax_seq_len = 256\n");
  EXPECT_CONTAINS(msg, "configs/x.toml");
  EXPECT_CONTAINS(msg, "data.seq_len (512) > model.max_seq_len (256)");
  EXPECT_CONTAINS(msg, "lower data.seq_len or raise model.max_seq_len");
}

TEST(Config, ValidationHeadsDivideWidth) {
  const std::string msg = parse_error("[model]\nd_model = 100\nn_head = 3\n");
  EXPECT_CONTAINS(msg, "model.d_model (100)");
  EXPECT_CONTAINS(msg, "model.n_head (3)");
}

TEST(Config, ValidationSizes) {
  const struct {
    const char* toml;
    const char* says;
  } cases[] = {
      {"[train]\nsteps = 0\n", "configs/x.toml: train.steps must be > 0, got 0"},
      {"[train]\nsteps = 1000000000\n", "train.steps = 1000000000 is more than 100000000"},
      {"[train]\nmicro_batch_size = -2\n", "train.micro_batch_size must be > 0, got -2"},
      {"[eval]\nbatches = 0\n", "eval.batches must be > 0"},
      {"[model]\nvocab_size = 2147483649\n",
       "model.vocab_size = 2147483649 is beyond what this build supports"},
      // Sizes that would wrap in the 32-bit ints of kernels and schedules (2^32 + 2 rows trained
      // as 2).
      {"[train]\nmicro_batch_size = 4294967298\n",
       "train.micro_batch_size = 4294967298 is beyond what this build supports (it must be below "
       "2147483648)"},
      {"[parallel]\nmicrobatches = 4294967296\n", "parallel.microbatches = 4294967296 is beyond"},
      {"[parallel]\ndp = 4294967296\n", "parallel.dp = 4294967296 is beyond"},
      {"[model]\nn_layer = 100000\n",
       "model.n_layer = 100000 is beyond what this build supports (it must be below 65536)"},
      {"[data]\nseq_len = 99999999999\n", "data.seq_len = 99999999999 is beyond"},
      {"[model]\nmax_seq_len = 4096\n[data]\nseq_len = 4096\n[train]\nmicro_batch_size = 1000000\n",
       "train.micro_batch_size × data.seq_len = 1000000 × 4096 tokens is beyond"},
      // Each factor within its bound, the step's tokens not (the plan printed -2.1 ZFLOP).
      {"[data]\nseq_len = 2\n[train]\nmicro_batch_size = 1073741823\n[parallel]\n"
       "microbatches = 2147483647\n",
       "a step of parallel.microbatches × train.micro_batch_size × data.seq_len = 2147483647 × "
       "1073741823 × 2 = 4.61e+18 tokens is beyond"},
      {"[parallel]\ndp = 65536\nmicrobatches = 65536\n[train]\nmicro_batch_size = 128\n",
       "a step of parallel.dp × parallel.microbatches × train.micro_batch_size × data.seq_len = "
       "65536 × 65536 × 128 × 256"},
      // Seconds beyond the int64 nanoseconds of a clock (1e300 s did not wait at all).
      {"[debug]\ndata_delay_s = 1e300\n", "debug.data_delay_s = 1e+300 s is more than 1e+09 s"},
      {"[parallel]\ncomm_timeout_s = 1e10\n",
       "parallel.comm_timeout_s = 10000000000 s is more than"},
      // A watchdog under a second would end healthy jobs (every multi-rank run exited 5).
      {"[parallel]\ncomm_timeout_s = 1e-9\n",
       "parallel.comm_timeout_s must be 0 (no timeout) or a number of seconds >= 1, got 1e-09"},
      // Figures no device has: MFU 1780991509 %, a capacity printed as 0.0 GiB.
      {"[progress]\npeak_tflops = 1e-9\n",
       "progress.peak_tflops = 1e-09 must be 0 (unknown) or in [0.001, 1e6]"},
      {"[progress]\nmem_capacity_gib = 1e-9\n",
       "progress.mem_capacity_gib = 1e-09 must be 0 (detect) or in [1/1024, 1e6]"},
      {"[progress]\npeak_tflops = nan\n", "progress.peak_tflops = nan must be 0"},
      // Faults that cannot fire: a fault test would pass without testing anything.
      {"[debug]\nfail_rank = 0\n", "debug.fail_rank = 0 and debug.fail_step = -1: set both"},
      {"[debug]\nslow_rank = 1\n", "debug.slow_rank = 1 and debug.slow_rank_s = 0: set both"},
      {"[debug]\nstall_s = 2\n", "debug.stall_step = -1 and debug.stall_s = 2: set both"},
      {"[train]\nsteps = 10\n[debug]\nfail_rank = 0\nfail_step = 10\n",
       "debug.fail_step = 10 is past the last step (9 of train.steps = 10, 0-based)"},
  };
  for (const auto& c : cases) {
    const std::string msg = parse_error(c.toml);
    EXPECT_CONTAINS(msg, c.says);
  }
}

TEST(Config, ValidationSchedule) {
  std::string msg = parse_error("[train]\nlr_schedule = \"linear\"\n");
  EXPECT_CONTAINS(msg, "train.lr_schedule \"linear\"");
  EXPECT_CONTAINS(msg, "\"cosine\"");
  msg = parse_error("[train]\nlr = 0.001\nmin_lr = 0.01\n");
  EXPECT_CONTAINS(msg, "train.min_lr (0.01) must be >= 0 and <= train.lr (0.001)");
  msg = parse_error("[train]\nlr = 0\n");
  EXPECT_CONTAINS(msg, "train.lr must be a number > 0 between 1.17549435e-38 and 3.40282347e+38");
  EXPECT_CONTAINS(msg, "got 0");
  msg = parse_error("[train]\nlr = nan\n");
  EXPECT_CONTAINS(msg, "train.lr must be a number > 0");
  // 0 or inf in fp32, where AdamW updates: the model froze without a word, or diverged
  msg = parse_error("[train]\nlr = 1e-46\nmin_lr = 0\n");
  EXPECT_CONTAINS(msg, "as fp32 holds it, got 1e-46");
  msg = parse_error("[train]\nlr = 1e39\n");
  EXPECT_CONTAINS(msg, "as fp32 holds it, got 1e+39");
  msg = parse_error("[train]\nwarmup_steps = -1\n");
  EXPECT_CONTAINS(msg, "train.warmup_steps must be >= 0, got -1");
}

TEST(Config, ValidationOptimizer) {
  std::string msg = parse_error("[train]\nbeta1 = 1.0\n");
  EXPECT_CONTAINS(msg, "train.beta1 must be in [0, 1) as fp32 holds it (at most 0.99999994");
  EXPECT_CONTAINS(msg, "got 1");
  msg = parse_error("[train]\nbeta2 = -0.1\n");
  EXPECT_CONTAINS(msg, "train.beta2 must be in [0, 1)");
  EXPECT_CONTAINS(msg, "got -0.1");
  // below 1 in double, 1 in fp32: AdamW's bias correction 1 - beta2^t was 0 and the loss NaN
  msg = parse_error("[train]\nbeta2 = 0.99999999\n");
  EXPECT_CONTAINS(msg, "train.beta2 must be in [0, 1) as fp32 holds it");
  EXPECT_EQ(parse_config("[train]\nbeta2 = 0.99999994\n", "configs/x.toml").train.beta2,
            0.99999994);
  // the smallest eps the message names is taken (it was refused: its decimal is below FLT_MIN)
  EXPECT_EQ(parse_config("[train]\neps = 1.17549435e-38\n", "configs/x.toml").train.eps,
            1.17549435e-38);
  msg = parse_error("[train]\ngrad_clip = 1e-50\n");  // 0 in fp32: every update scaled to 0
  EXPECT_CONTAINS(msg, "train.grad_clip must be 0 (off) or a number between");
  msg = parse_error("[train]\neps = 0\n");
  EXPECT_CONTAINS(msg, "train.eps");
  // 0 in fp32, where AdamW updates: it divided by zero and the run diverged
  msg = parse_error("[train]\neps = 1e-46\n");
  EXPECT_CONTAINS(msg,
                  "train.eps must be a finite number >= 1.17549435e-38 (the smallest normal fp32");
  msg = parse_error("[train]\nweight_decay = -1\n");
  EXPECT_CONTAINS(msg, "train.weight_decay");
  msg = parse_error("[train]\ngrad_clip = -1\n");
  EXPECT_CONTAINS(msg, "train.grad_clip");
  msg = parse_error("[eval]\ninterval = -5\n");
  EXPECT_CONTAINS(msg, "eval.interval must be >= 0");
}

TEST(Config, ValidationPipelineSchedule) {
  EXPECT_EQ(parse_config("[parallel]\nschedule = \"afab\"\n", "configs/x.toml").parallel.schedule,
            "afab");
  EXPECT_EQ(parse_config("", "configs/x.toml").parallel.schedule, "1f1b");
  const std::string msg = parse_error("[parallel]\nschedule = \"gpipe\"\n");
  EXPECT_CONTAINS(msg, "unknown parallel.schedule \"gpipe\"; use \"1f1b\"");
}

TEST(Config, RunNameIsOneDirectoryName) {
  for (const char* bad : {"", ".", "..", "sweep/a", "/abs"}) {
    const std::string msg = parse_error("", {fmt::format("run.name=\"{}\"", bad)});
    EXPECT_CONTAINS(msg, "must be one directory name");
  }
  EXPECT_NO_THROW(parse_config("[run]\nname = \"gpt2-small_v2.1\"\n", "configs/x.toml"));
}

TEST(Config, RunOutDirMustNotBeEmpty) {
  EXPECT_CONTAINS(parse_error("", {"run.out_dir=\"\""}), "run.out_dir is empty");
  EXPECT_EQ(parse_config("[run]\nout_dir = \".\"\n", "configs/x.toml").run.out_dir, ".");
}

TEST(Config, ValidationRunDevice) {
  EXPECT_EQ(parse_config("", "configs/x.toml").run.device, "cpu");
  EXPECT_EQ(parse_config("[run]\ndevice = \"auto\"\n", "configs/x.toml").run.device, "auto");
  EXPECT_EQ(parse_config("[run]\ndevice = \"cuda\"\n", "configs/x.toml").run.device, "cuda");
  const std::string msg = parse_error("[run]\ndevice = \"gpu\"\n");
  EXPECT_CONTAINS(msg, "unknown run.device \"gpu\"; use \"cpu\", \"cuda\" or \"auto\"");
}

TEST(Config, ValidationRunPrecision) {
  EXPECT_EQ(parse_config("", "configs/x.toml").run.precision, "fp32");
  EXPECT_EQ(parse_config("[run]\nprecision = \"bf16\"\n", "configs/x.toml").run.precision, "bf16");
  const std::string msg = parse_error("[run]\nprecision = \"fp16\"\n");
  EXPECT_CONTAINS(msg, "unknown run.precision \"fp16\"; use \"fp32\" or \"bf16\"");
}

TEST(Config, ValidationDataMode) {
  EXPECT_NO_THROW(parse_config("[data]\nmode = \"packed\"\n", "configs/x.toml"));
  EXPECT_NO_THROW(parse_config("[data]\nmode = \"padded\"\n", "configs/x.toml"));
  std::string msg = parse_error("[data]\nmode = \"random\"\n");
  EXPECT_CONTAINS(msg, "unknown data.mode \"random\"");
  msg = parse_error("[data]\npack_algorithm = \"ffd\"\n");
  EXPECT_CONTAINS(msg, "unknown data.pack_algorithm \"ffd\"");
  msg = parse_error("[data]\npack_window = 0\n");
  EXPECT_CONTAINS(msg, "data.pack_window must be > 0");
  msg = parse_error("[data]\nlong_docs = \"truncate\"\n");
  EXPECT_CONTAINS(msg, "unknown data.long_docs \"truncate\"");
}

TEST(Config, ValidateAfterEditNamesSourceOrConfig) {
  RunConfig cfg;
  EXPECT_NO_THROW(validate_config(cfg));
  cfg.train.steps = -1;
  std::string msg = error_of([&] { validate_config(cfg); });
  EXPECT_CONTAINS(msg, "config: train.steps must be > 0, got -1");
  cfg.source = "runs/a/config.toml";
  msg = error_of([&] { validate_config(cfg); });
  EXPECT_CONTAINS(msg, "runs/a/config.toml: train.steps");
}

// ---- config_to_toml ------------------------------------------------------------------------

TEST(Config, ToTomlListsEveryKeyAndWritesFloatsAsFloats) {
  RunConfig cfg;
  cfg.train.grad_clip = 1.0;
  cfg.train.min_lr = 0.0;
  const std::string text = config_to_toml(cfg);
  for (const char* line : {"[run]\n", "[model]\n", "[data]\n", "[train]\n", "[eval]\n",
                           "name = \"run\"\n", "seed = 1337\n", "vocab_size = 257\n",
                           "train = \"\"\n", "shuffle = false\n", "lr = 0.0003\n",
                           "grad_clip = 1.0\n", "min_lr = 0.0\n", "eps = 1e-08\n",
                           "interval = 0\n", "batches = 4\n"}) {
    EXPECT_CONTAINS(text, line);
  }
}

TEST(Config, DifferencesNameEachDifferingKeyWithBothValues) {
  RunConfig a, b;
  EXPECT_TRUE(config_differences(a, b).empty());
  b.train.steps = a.train.steps + 1;
  b.data.train = "other.h5";
  b.data.shuffle = !a.data.shuffle;
  const std::vector<std::string> d = config_differences(a, b);
  ASSERT_EQ(d.size(), 3u);  // in config order: data before train
  EXPECT_EQ(d[0], "data.train = \"\" vs \"other.h5\"");
  EXPECT_EQ(d[1], fmt::format("data.shuffle = {} vs {}", a.data.shuffle, b.data.shuffle));
  EXPECT_EQ(d[2], fmt::format("train.steps = {} vs {}", a.train.steps, b.train.steps));
}

TEST(Config, RoundTripNonDefaults) {
  RunConfig cfg;
  cfg.run.name = "quote\" back\\slash\ttab\nnewline \x01 unicode \xc3\xa9";
  cfg.run.out_dir = "/scratch/runs";
  cfg.run.seed = -7;
  cfg.model.n_layer = 6;
  cfg.model.n_head = 8;
  cfg.model.d_model = 512;
  cfg.model.vocab_size = 50304;
  cfg.model.max_seq_len = 2048;
  cfg.data.train = "d/train.h5";
  cfg.data.val = "d/val.h5";
  cfg.data.seq_len = 1024;
  cfg.data.shuffle = true;
  cfg.train.micro_batch_size = 16;
  cfg.train.steps = 123456;
  cfg.train.lr = 3e-4;
  cfg.train.min_lr = 0.1 * 3e-4;
  cfg.train.lr_schedule = "constant";
  cfg.train.warmup_steps = 700;
  cfg.train.beta1 = 1.0 / 3.0;
  cfg.train.beta2 = 0.999;
  cfg.train.eps = double(std::numeric_limits<float>::min());  // the smallest accepted
  cfg.train.weight_decay = 5e-324;                            // the smallest subnormal double
  cfg.train.grad_clip = 0.1;
  cfg.train.log_interval = 3;
  cfg.eval.interval = 50;
  cfg.eval.batches = 2;
  // every other section off its defaults too: a key that wrote or read back wrong at another
  // value than its default would pass at its default
  cfg.run.device = "auto";
  cfg.run.precision = "bf16";
  cfg.model.init_from = "ckpt/step-00000010";
  cfg.data.mode = "packed";
  cfg.data.pack_algorithm = "next_fit";
  cfg.data.pack_window = 500;
  cfg.data.pack_align = 8;
  cfg.data.long_docs = "drop";
  cfg.data.pack_plan = "d/plan.h5";
  cfg.parallel.tp = 2;
  cfg.parallel.pp = 3;
  cfg.parallel.cp = 2;
  cfg.parallel.dp = 5;
  cfg.parallel.zero = 1;
  cfg.parallel.microbatches = 4;
  cfg.parallel.schedule = "afab";
  cfg.parallel.comm_timeout_s = 120.5;
  cfg.checkpoint.dir = "/scratch/ckpt";
  cfg.checkpoint.interval = 500;
  cfg.checkpoint.keep_last = 3;
  cfg.checkpoint.final = false;
  cfg.progress.interval = 25;
  cfg.progress.warmup_steps = 10;
  cfg.progress.peak_tflops = 312.5;
  cfg.progress.mem_capacity_gib = 40.25;
  cfg.progress.window_end = "2026-12-03T20:00:00Z";
  cfg.reservation.id = 42;
  cfg.reservation.ledger = "/scratch/ledger.db";
  cfg.reservation.lease_ttl_s = 90;
  cfg.reservation.stop_margin_s = 45;
  cfg.reservation.checkpoint_estimate_s = 120;
  cfg.reservation.on_demand_s = 1800;
  cfg.debug.fail_rank = 1;
  cfg.debug.fail_step = 7;
  cfg.debug.checkpoint_pause_s = 0.5;
  cfg.debug.data_delay_s = 0.25;
  cfg.debug.slow_rank = 1;
  cfg.debug.slow_rank_s = 0.125;
  cfg.debug.leak_mib_per_step = 2;
  cfg.debug.stall_step = 9;
  cfg.debug.stall_s = 1.5;
  cfg.source = "roundtrip.toml";

  const std::string text = config_to_toml(cfg);
  const RunConfig back = parse_config(text, "roundtrip.toml");
  expect_same(back, cfg);
  EXPECT_EQ(config_to_toml(back), text);
}

TEST(Config, RoundTripMinLrPointOne) {
  RunConfig cfg;
  cfg.train.lr = 0.5;
  cfg.train.min_lr = 0.1;
  const RunConfig back = parse_config(config_to_toml(cfg), "x.toml");
  expect_same(back, cfg);
  EXPECT_EQ(back.train.min_lr, 0.1);
  EXPECT_EQ(back.train.lr, 0.5);
}

TEST(Config, RoundTripManyDoubles) {
  // Values whose shortest decimal form needs all 17 digits, exponents and large magnitudes.
  for (double v : {0.1, 0.2 + 0.1, 1.0 / 7.0, 2.0 / 3.0, 1e-300, 0.999999999999999889,
                   std::nextafter(0.9, 1.0), std::numeric_limits<double>::min(), 123456789.0,
                   1e15, 1e22, 4.9406564584124654e-320}) {
    RunConfig cfg;
    cfg.train.weight_decay = v;
    const RunConfig back = parse_config(config_to_toml(cfg), "x.toml");
    EXPECT_EQ(back.train.weight_decay, v) << "weight_decay written as: " << config_to_toml(cfg);
  }
}

}  // namespace
}  // namespace berth
