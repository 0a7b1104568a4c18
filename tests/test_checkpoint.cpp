// Checkpoints: atomic save, exact resume (bit-identical losses), incomplete and corrupt
// checkpoints, init_from, retention. Runs as one MPI rank (tests/mpi_test_main.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cluster/progress.h"
#include "runtime/core/fs.h"
#include "runtime/io/hdf5_util.h"
#include "runtime/io/token_dataset.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/resume_changes.h"
#include "runtime/train/trainer.h"
#include "tests/expect_error.h"
#include "tests/mpi_world.h"
#include "tests/synthetic_data.h"

namespace berth {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("berth_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_token_dataset((dir_ / "train.h5").string(), test::rule_dataset(60, 40, 9));
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunConfig config(int64_t steps, bool shuffle, int64_t zero = 0) const {
    RunConfig c;
    c.run.name = "r";
    c.run.out_dir = (dir_ / "runs").string();
    c.run.seed = 11;
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.d_model = 32;
    c.model.vocab_size = test::kRuleVocab;
    c.model.max_seq_len = 16;
    c.data.train = (dir_ / "train.h5").string();
    c.data.seq_len = 16;
    c.data.shuffle = shuffle;
    c.train.micro_batch_size = 4;
    c.train.steps = steps;
    c.train.lr = 3e-3;
    c.train.warmup_steps = 3;
    c.parallel.zero = zero;
    c.checkpoint.interval = 10;
    c.checkpoint.final = false;
    return c;
  }

  // Trains `cfg` with a final checkpoint and returns that checkpoint's directory.
  static std::string trained_checkpoint(RunConfig cfg) {
    cfg.checkpoint.final = true;
    Trainer a(cfg, test::world());
    a.run();
    return a.checkpoint_dir() + "/" + checkpoint_dir_name(cfg.train.steps);
  }

  static std::vector<double> losses(const std::vector<StepStats>& stats) {
    std::vector<double> out;
    for (const StepStats& s : stats) out.push_back(s.loss);
    return out;
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, ResumeIsBitIdenticalWithAndWithoutShuffle) {
  for (bool shuffle : {false, true}) {
    for (int64_t zero : {0, 1}) {
      RunConfig full = config(20, shuffle, zero);
      full.run.name = fmt::format("full_{}_{}", shuffle, zero);
      Trainer a(full, test::world());
      const std::vector<double> whole = losses(a.run());
      ASSERT_EQ(whole.size(), 20u);
      const std::string step10 = a.checkpoint_dir() + "/" + checkpoint_dir_name(10);
      ASSERT_TRUE(fs::exists(step10 + "/meta.json"));

      RunConfig second = full;
      second.run.name = fmt::format("resumed_{}_{}", shuffle, zero);
      Trainer b(second, test::world());
      b.resume(step10);
      EXPECT_EQ(b.start_step(), 10);
      const std::vector<double> rest = losses(b.run());
      ASSERT_EQ(rest.size(), 10u);
      for (size_t i = 0; i < 10; i++) {
        EXPECT_EQ(rest[i], whole[10 + i]) << "step " << 11 + i << " shuffle " << shuffle
                                          << " zero " << zero;
      }
    }
  }
}

TEST_F(CheckpointTest, PackedModeResumesToTheSameRows) {
  RunConfig full = config(20, true);
  full.data.mode = "packed";
  full.run.name = "packed_full";
  Trainer a(full, test::world());
  const std::vector<double> whole = losses(a.run());
  RunConfig second = full;
  second.run.name = "packed_resumed";
  Trainer b(second, test::world());
  b.resume(a.checkpoint_dir() + "/" + checkpoint_dir_name(10));
  const std::vector<double> rest = losses(b.run());
  ASSERT_EQ(rest.size(), 10u);
  for (size_t i = 0; i < 10; i++) EXPECT_EQ(rest[i], whole[10 + i]) << "step " << 11 + i;
}

TEST(ResumeChanges, DataOrderAndScheduleChangesAreNamed) {
  RunConfig saved;
  saved.data.train = "d.h5";
  saved.train.steps = 20;
  saved.train.lr_schedule = "cosine";
  EXPECT_EQ(describe_resume_changes(saved, 8, saved, 8, 10, 80), "");
  // The layout alone (rows per step kept) and settings that do not order the data are free.
  RunConfig now = saved;
  now.parallel.tp = 2;
  now.train.log_interval = 7;
  now.run.seed = 99;  // an unshuffled stream does not use the seed
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80), "");

  now = saved;
  now.data.seq_len = 128;
  std::string d = describe_resume_changes(saved, 8, now, 16, 10, 80);
  EXPECT_NE(d.find("data order differs"), std::string::npos) << d;
  EXPECT_NE(d.find("data.seq_len 256 → 128"), std::string::npos) << d;
  EXPECT_NE(d.find("rows_consumed 80"), std::string::npos) << d;
  EXPECT_EQ(d.find("learning rate"), std::string::npos) << d;
  // The global batch apart: the loaders read the same sequence of rows in steps of another size.
  EXPECT_EQ(d.find("rows per step"), std::string::npos) << d;
  EXPECT_NE(d.find("the global batch is 16 rows a step where the saved run's was 8"),
            std::string::npos)
      << d;
  d = describe_resume_changes(saved, 8, saved, 16, 10, 80);
  EXPECT_EQ(d.find("data order"), std::string::npos) << d;
  EXPECT_NE(d.find("the data goes on at the same row"), std::string::npos) << d;

  // Packed rows: context parallelism changes the automatic alignment, so the plan.
  saved.data.mode = now.data.mode = "packed";
  now = saved;
  now.parallel.cp = 2;
  d = describe_resume_changes(saved, 8, now, 8, 10, 80);
  EXPECT_NE(d.find("packing alignment 1 → 4 (automatic: 2·cp for parallel.cp = 2)"),
            std::string::npos)
      << d;
  EXPECT_EQ(d.find("keeps the saved order"), std::string::npos) << d;  // cp 2 refuses align 1
  now.data.pack_align = 1;  // kept by hand: the same plan
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80), "");
  // Saved at cp 2, resumed without: the saved alignment is one this layout takes, and said.
  RunConfig at_cp2 = saved;
  at_cp2.parallel.cp = 2;
  d = describe_resume_changes(at_cp2, 8, saved, 8, 10, 80);
  EXPECT_NE(d.find("packing alignment 4 → 1 (--set data.pack_align=4 keeps the saved order)"),
            std::string::npos)
      << d;
  now = saved;
  now.run.seed = 5;  // packing is seeded
  EXPECT_NE(describe_resume_changes(saved, 8, now, 8, 10, 80).find("run.seed 1337 → 5"),
            std::string::npos);

  // The schedule: a cosine over more steps gives step 11 another learning rate ...
  now = saved;
  now.train.steps = 40;
  d = describe_resume_changes(saved, 8, now, 8, 10, 80);
  EXPECT_NE(d.find("learning rate of step 11"), std::string::npos) << d;
  EXPECT_NE(d.find("train.steps 20 → 40"), std::string::npos) << d;
  EXPECT_EQ(d.find("data order"), std::string::npos) << d;
  // ... a constant one does not.
  saved.train.lr_schedule = now.train.lr_schedule = "constant";
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80), "");
  {  // A change that shows only after a warm-up the checkpoint is in: the first step it moves.
    RunConfig warm = saved, cosine = saved;
    warm.train.warmup_steps = cosine.train.warmup_steps = 10;
    warm.train.lr_schedule = "cosine";
    cosine.train.steps = 40, cosine.train.lr_schedule = "constant";
    d = describe_resume_changes(warm, 8, cosine, 8, 5, 40);
    EXPECT_NE(d.find("the learning rate of step 12 is"), std::string::npos) << d;
    EXPECT_NE(d.find("(steps 6..11 are the same)"), std::string::npos) << d;
    EXPECT_NE(d.find("train.lr_schedule cosine → constant"), std::string::npos) << d;
    // A finished run extended: its last rate had decayed to min_lr; the next one is far above.
    RunConfig done = saved, longer = saved;
    done.train.lr_schedule = longer.train.lr_schedule = "cosine";
    done.train.min_lr = longer.train.min_lr = 3e-5;
    longer.train.steps = 40;
    d = describe_resume_changes(done, 8, longer, 8, 20, 160);
    EXPECT_NE(d.find("the learning rate of step 21 is"), std::string::npos) << d;
    EXPECT_NE(d.find("where the saved run's schedule gives 3e-05"), std::string::npos) << d;
    EXPECT_NE(d.find("train.steps 20 → 40"), std::string::npos) << d;
    // (a constant schedule over more steps gives the shared ones the same rate)
    cosine.train.lr_schedule = "constant", warm.train.lr_schedule = "constant";
    EXPECT_EQ(describe_resume_changes(warm, 8, cosine, 8, 5, 40), "");
  }

  // Other data at the same path: named by its fingerprint; unknown (an older checkpoint) is no
  // change, and another path is named as such.
  now = saved;
  d = describe_resume_changes(saved, 8, now, 8, 10, 80, "9 tokens in 1 documents, a", "b");
  EXPECT_NE(d.find("the contents of data.train (9 tokens in 1 documents, a) → (b)"),
            std::string::npos)
      << d;
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80, "", "b"), "");
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80, "a", "a"), "");
  now.data.train = "e.h5";
  d = describe_resume_changes(saved, 8, now, 8, 10, 80, "a", "b");
  EXPECT_NE(d.find("data.train d.h5 → e.h5"), std::string::npos) << d;
  EXPECT_EQ(d.find("contents"), std::string::npos) << d;
  // The same contents at another path (moved, copied, or a relative path made absolute): the
  // same data. Without fingerprints, a path that resolves to the same file is the same.
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80, "a", "a"), "");
  now.data.train = (std::filesystem::current_path() / "d.h5").string();
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80), "");
  now.data.train = ".//d.h5";
  EXPECT_EQ(describe_resume_changes(saved, 8, now, 8, 10, 80), "");
}

TEST_F(CheckpointTest, ResumeWithALongerScheduleWarns) {
  RunConfig first = config(12, false);
  Trainer a(first, test::world());
  a.run();
  RunConfig longer = first;
  longer.train.steps = 30;
  {  // a Trainer holds its run directory's lock while it lives (run_dir_lock.h)
    Trainer b(longer, test::world());
    ::testing::internal::CaptureStderr();
    b.resume(a.checkpoint_dir() + "/" + checkpoint_dir_name(10));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("with other settings than the run that saved it"), std::string::npos) << err;
    EXPECT_NE(err.find("train.steps 12 → 30"), std::string::npos) << err;
  }
  ::testing::internal::CaptureStderr();
  {
    Trainer c(first, test::world());
    c.resume(a.checkpoint_dir() + "/" + checkpoint_dir_name(10));
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  // The same path holding other data (re-imported or replaced): rows_consumed now indexes another
  // corpus, and nothing said so.
  const CheckpointData saved =
      load_checkpoint(a.checkpoint_dir() + "/" + checkpoint_dir_name(10), false);
  EXPECT_EQ(saved.meta.data_fingerprint,
            dataset_fingerprint(read_token_dataset((dir_ / "train.h5").string())));
  write_token_dataset((dir_ / "train.h5").string(), test::rule_dataset(60, 40, 10));
  ::testing::internal::CaptureStderr();
  {
    Trainer d(first, test::world());
    d.resume(a.checkpoint_dir() + "/" + checkpoint_dir_name(10));
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the contents of data.train (2460 tokens in 60 documents, "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("rows_consumed"), std::string::npos) << err;
}

// A killed session leaves trace.csv.partial, its last row possibly cut short. The resumed session
// archives it with whole rows only and with the killed session's run_facts.json beside it, so it
// replays (it failed on the cut row, and against the new session's facts).
TEST_F(CheckpointTest, AResumeArchivesTheKilledSessionsTraceWholeWithItsFacts) {
  RunConfig cfg = config(14, false);
  Trainer a(cfg, test::world());
  a.run();
  const std::string run = a.run_dir();
  fs::rename(run + "/trace.csv", run + "/trace.csv.partial");  // as a kill leaves it
  std::ofstream(run + "/trace.csv.partial", std::ios::app) << "15,0.01";
  Trainer b(cfg, test::world());
  b.resume(a.checkpoint_dir() + "/" + checkpoint_dir_name(10));
  b.run();
  const std::vector<StepRecord> rows = read_trace_csv(run + "/trace.before-10.csv");
  ASSERT_EQ(rows.size(), 14u);
  const RunFacts facts = read_run_facts_json(run + "/run_facts.before-10.json");
  EXPECT_EQ(facts.start_step, 0);
  check_trace_in_session(rows, facts, "trace.before-10.csv", "run_facts.before-10.json");
  EXPECT_EQ(read_run_facts_json(run + "/run_facts.json").start_step, 10);  // the new session's
}

TEST_F(CheckpointTest, ResumeAutoPicksTheNewestCompleteAndCleansPartials) {
  RunConfig cfg = config(18, true);  // saves at 5, 10 and 15
  cfg.checkpoint.interval = 5;
  Trainer a(cfg, test::world());
  a.run();
  const std::string ck = a.checkpoint_dir();
  // An interrupted save of a later step: a temporary directory without meta.json.
  fs::create_directories(ck + "/step-00000017.tmp-999");
  std::ofstream(ck + "/step-00000017.tmp-999/model.h5") << "half";
  // A complete-looking name without meta.json is not complete either.
  fs::create_directories(ck + "/step-00000019");
  EXPECT_EQ(latest_checkpoint(ck).value(), ck + "/" + checkpoint_dir_name(15));

  RunConfig more = cfg;
  Trainer b(more, test::world());
  b.resume("auto");
  EXPECT_EQ(b.start_step(), 15);
  b.run();
  EXPECT_FALSE(fs::exists(ck + "/step-00000017.tmp-999")) << "partial save not cleaned";
}

TEST_F(CheckpointTest, KeepLastPrunesOlderCheckpoints) {
  RunConfig cfg = config(20, false);
  cfg.checkpoint.interval = 4;
  cfg.checkpoint.keep_last = 2;
  cfg.checkpoint.final = true;
  Trainer a(cfg, test::world());
  a.run();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(a.checkpoint_dir())) {
    const std::string name = e.path().filename();
    if (name != ".berth.lock") names.push_back(name);  // (the run's lock of the directory)
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{checkpoint_dir_name(16), checkpoint_dir_name(20)}));
}

TEST_F(CheckpointTest, TheLastStepSavesAtAMultipleOfTheIntervalWithoutFinal) {
  // checkpoint.final = false leaves out the save after the last step only where the interval
  // does: "save every N steps" saved at 10 and 20 of 30 steps, and lost the last 10.
  RunConfig cfg = config(30, false);  // interval 10, final false
  Trainer a(cfg, test::world());
  a.run();
  for (int64_t step : {10, 20, 30}) {
    EXPECT_TRUE(fs::exists(a.checkpoint_dir() + "/" + checkpoint_dir_name(step) + "/meta.json"))
        << step;
  }
  cfg.run.name = "not_a_multiple";
  cfg.train.steps = 25;
  Trainer b(cfg, test::world());
  b.run();
  EXPECT_FALSE(fs::exists(b.checkpoint_dir() + "/" + checkpoint_dir_name(25)));
  EXPECT_EQ(latest_checkpoint(b.checkpoint_dir()).value(),
            b.checkpoint_dir() + "/" + checkpoint_dir_name(20));
}

TEST_F(CheckpointTest, GoingBackToAnEarlierCheckpointSaysHowToBranch) {
  RunConfig cfg = config(30, false);
  Trainer a(cfg, test::world());
  a.run();
  const std::string step10 = a.checkpoint_dir() + "/" + checkpoint_dir_name(10);
  // Resumed from step 10 of the run's own checkpoints, it would save over step 20 and 30: it was
  // told those were "an earlier run" to continue with --resume auto (which continues from 30).
  Trainer b(cfg, test::world(), nullptr, step10);
  EXPECT_EQ(b.start_step(), 10);
  test::expect_error([&] { b.run(); },
                     {"this run resumes from " + step10 + " at step 10",
                      "holds later checkpoints (the newest, step-00000030, is at step 30)",
                      "move the step directories after it out of",
                      "another run.name (or checkpoint.dir) and keep --resume " + step10});
  // ... which works: a new run.name branches from step 10.
  cfg.run.name = "branch";
  Trainer c(cfg, test::world(), nullptr, step10);
  c.run();
  EXPECT_TRUE(fs::exists(c.checkpoint_dir() + "/" + checkpoint_dir_name(30) + "/meta.json"));
}

TEST_F(CheckpointTest, AResumeDoesNotReadInitFrom) {
  RunConfig cfg = config(10, false);
  Trainer a(cfg, test::world());
  a.run();
  const fs::path copy = dir_ / "pretrained";
  fs::copy(a.checkpoint_dir() + "/" + checkpoint_dir_name(10), copy);
  RunConfig ft = cfg;
  ft.run.name = "finetune";
  ft.model.init_from = copy.string();
  ft.train.steps = 20;
  {
    Trainer b(ft, test::world());
    b.run();
  }
  // The pretrained weights are gone (scratch cleaned): the resume replaces them anyway.
  fs::remove_all(copy);
  ft.train.steps = 30;
  Trainer c(ft, test::world(), nullptr, "auto");
  EXPECT_EQ(c.start_step(), 20);
  // A start from step 0 still needs them, and says which key names them.
  ft.run.name = "fresh";
  test::expect_error([&] { Trainer d(ft, test::world(), nullptr, "auto"); },
                     {"model.init_from: ", "does not exist"});
}

TEST_F(CheckpointTest, ShapeMismatchIsExplained) {
  RunConfig cfg = config(10, false);
  const std::string step10 = trained_checkpoint(cfg);
  RunConfig other = cfg;
  other.run.name = "other";
  other.model.n_layer = 3;
  other.model.d_model = 64;
  Trainer b(other, test::world());
  test::expect_error([&] { b.resume(step10); },
                     {"its model differs from the config", "n_layer: checkpoint 2, config 3",
                      "d_model: checkpoint 32, config 64"});
  other.model.init_from = step10;
  test::expect_error([&] { Trainer c(other, test::world()); },
                     {"does not fit this model", "n_layer: checkpoint 2, config 3"});
}

TEST_F(CheckpointTest, InitFromLoadsWeightsWithAFreshOptimizer) {
  RunConfig cfg = config(10, false);
  const std::string step10 = trained_checkpoint(cfg);
  RunConfig b_cfg = cfg;
  b_cfg.run.name = "b";
  b_cfg.model.init_from = step10;
  Trainer b(b_cfg, test::world());
  EXPECT_TRUE(b.model().params_host() == load_checkpoint(step10, false).params);
  EXPECT_EQ(b.start_step(), 0);
  const CheckpointData ck = load_checkpoint(step10, true);
  EXPECT_TRUE(ck.has_optimizer());
  EXPECT_EQ(ck.adam_step, 10);
  EXPECT_EQ(ck.meta.step, 10);
  EXPECT_FALSE(ck.meta.fencing_token.has_value());
}

TEST_F(CheckpointTest, IncompleteCorruptAndForeignCheckpointsAreRefused) {
  RunConfig cfg = config(10, false);
  cfg.checkpoint.final = true;
  Trainer a(cfg, test::world());
  a.run();
  const std::string good = a.checkpoint_dir() + "/" + checkpoint_dir_name(10);
  const fs::path work = dir_ / "copies";
  fs::create_directories(work);

  test::expect_error([&] { load_checkpoint((work / "nope").string(), true); }, {"does not exist"});
  // model.init_from given what `berth model import` reads: said so, with the command.
  std::ofstream((work / "gpt2.bin").string()) << "llm.c";
  test::expect_error(
      [&] { load_checkpoint((work / "gpt2.bin").string(), false); },
      {"is a file, and a berth checkpoint is a directory", "berth model import --format llmc"});
  test::expect_error([&] { load_checkpoint(good + "/model.h5", true); },
                     {"is a file of the checkpoint '" + good + "': give the directory"});
  fs::create_directories(work / "hf");
  std::ofstream((work / "hf" / "config.json").string()) << "{}";
  test::expect_error([&] { load_checkpoint((work / "hf").string(), false); },
                     {"a Hugging Face model directory", "berth model import --format hf-gpt2"});

  fs::copy(good, work / "no_meta", fs::copy_options::recursive);
  fs::remove(work / "no_meta" / "meta.json");
  test::expect_error([&] { load_checkpoint((work / "no_meta").string(), true); },
                     {"no meta.json", "incomplete checkpoint"});

  fs::copy(good, work / "newer", fs::copy_options::recursive);
  {
    std::string meta = read_text_file((work / "newer" / "meta.json").string());
    const size_t at = meta.find("\"format_version\": 1");
    ASSERT_NE(at, std::string::npos);
    meta.replace(at, 19, "\"format_version\": 7");
    std::ofstream((work / "newer" / "meta.json").string()) << meta;
  }
  test::expect_error([&] { load_checkpoint((work / "newer").string(), true); },
                     {"format_version 7, this build reads 1"});

  // Flip bytes in the middle of the model file: a Fletcher-32 checksum (or the HDF5 structure)
  // catches it — never silently different weights.
  fs::copy(good, work / "flipped", fs::copy_options::recursive);
  {
    const std::string p = (work / "flipped" / "model.h5").string();
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(p);
    for (uint64_t pos = size / 3; pos < size / 3 + 64; pos++) {
      f.seekp(std::streamoff(pos));
      f.put(char(0x5A));
    }
  }
  test::expect_error([&] { load_checkpoint((work / "flipped").string(), true); },
                     {"model.h5", "unreadable"});

  // meta.json edited or copied: a negative data position (it indexed the loader's permutation
  // with a negative row), a step other than the directory's name.
  auto edit_meta = [&](const std::string& name, const std::string& from, const std::string& to) {
    fs::copy(good, work / name, fs::copy_options::recursive);
    std::string meta = read_text_file((work / name / "meta.json").string());
    size_t at = 0;
    while ((at = meta.find(from, at)) != std::string::npos) {
      meta.replace(at, from.size(), to);
      at += to.size();
    }
    std::ofstream((work / name / "meta.json").string()) << meta;
  };
  const std::string rows = "\"rows_consumed\": ";
  const std::string meta_text = read_text_file(good + "/meta.json");
  const size_t at = meta_text.find(rows);
  ASSERT_NE(at, std::string::npos);
  const std::string rows_field = meta_text.substr(at, meta_text.find(',', at) - at);
  edit_meta("negative_rows", rows_field, rows + "-5");
  test::expect_error([&] { load_checkpoint((work / "negative_rows").string(), true); },
                     {"rows_consumed -5", "must be >= 0", "corrupt"});
  edit_meta("huge_rows", rows_field, rows + "9223372036854775800");
  test::expect_error([&] { load_checkpoint((work / "huge_rows").string(), true); },
                     {"rows_consumed 9223372036854775800", "< 2^62", "corrupt"});
  edit_meta("step-00000012", "\"step\": 10", "\"step\": 10");
  test::expect_error([&] { load_checkpoint((work / "step-00000012").string(), true); },
                     {"says step 10", "named for step 12"});
  test::expect_error([&] { load_checkpoint((work / "step-00000012/").string(), true); },
                     {"named for step 12"});
  // A run directory instead of one of its checkpoints: the newest is named.
  test::expect_error([&] { load_checkpoint(a.run_dir(), true); },
                     {"is not a checkpoint but holds checkpoints", checkpoint_dir_name(10)});

  fs::copy(good, work / "truncated", fs::copy_options::recursive);
  fs::resize_file(work / "truncated" / "optimizer.h5", fs::file_size(work / "truncated" / "optimizer.h5") / 2);
  test::expect_error([&] { load_checkpoint((work / "truncated").string(), true); },
                     {"optimizer.h5", "unreadable"});
  // A file missing (a partial copy): an older checkpoint is the way on, as for a truncated one.
  fs::copy(good, work / "no_optimizer", fs::copy_options::recursive);
  fs::remove(work / "no_optimizer" / "optimizer.h5");
  test::expect_error([&] { load_checkpoint((work / "no_optimizer").string(), true); },
                     {"optimizer.h5' is missing", "use an older checkpoint"});

  // meta.json of the wrong shape or types: a berth::Error naming the file, not a JSON exception.
  fs::copy(good, work / "array_meta", fs::copy_options::recursive);
  std::ofstream((work / "array_meta" / "meta.json").string()) << "[]";
  test::expect_error([&] { load_checkpoint((work / "array_meta").string(), true); },
                     {"array_meta/meta.json' is not a berth checkpoint"});
  edit_meta("string_version", "\"format_version\": 1", "\"format_version\": \"1\"");
  test::expect_error([&] { load_checkpoint((work / "string_version").string(), true); },
                     {"has no whole-number format_version (\"1\")", "corrupt"});
  // Counts that are not whole numbers were truncated (10.5) or wrapped (1e30).
  edit_meta("fractional_rows", rows_field, rows + "20.5");
  test::expect_error([&] { load_checkpoint((work / "fractional_rows").string(), true); },
                     {"'rows_consumed' must be a whole number, got 20.5", "corrupt"});
  edit_meta("huge_step", "\"step\": 10", "\"step\": 1e30");
  test::expect_error([&] { load_checkpoint((work / "huge_step").string(), true); },
                     {"'step' must be a whole number, got 1e+30", "corrupt"});
  edit_meta("string_optimizer", "\"optimizer\": true", "\"optimizer\": \"true\"");
  test::expect_error([&] { load_checkpoint((work / "string_optimizer").string(), true); },
                     {"lacks a field or has a wrong type", "corrupt"});
  // An optimizer state whose AdamW step count is not the checkpoint's step (copied from another).
  CheckpointData other = load_checkpoint(good, true);
  other.adam_step = 7;
  save_checkpoint((work / "other_adam").string(), other);
  test::expect_error([&] { load_checkpoint((work / "other_adam").string(), true); },
                     {"has adam_step 7, but meta.json says step 10", "not this checkpoint's"});
  // One file copied from a checkpoint of a deeper model: a model.h5 is named as the stranger
  // (optimizer.h5 was blamed for not matching it), an optimizer.h5 still is.
  CheckpointData deeper = load_checkpoint(good, true);
  deeper.model =
      make_gpt_config(3, deeper.model.NH, deeper.model.C, deeper.model.V, deeper.model.maxT);
  const int64_t deeper_total = gpt_param_layout(deeper.model).total;
  for (std::vector<float>* t : {&deeper.params, &deeper.adam_m, &deeper.adam_v})
    t->assign(size_t(deeper_total), 0.01f);
  save_checkpoint((work / "deeper").string(), deeper);
  for (const char* file : {"model.h5", "optimizer.h5"}) {
    const fs::path swapped = work / (std::string("swapped_") + file);
    fs::copy(good, swapped, fs::copy_options::recursive);
    fs::copy_file(work / "deeper" / file, swapped / file, fs::copy_options::overwrite_existing);
  }
  test::expect_error([&] { load_checkpoint((work / "swapped_model.h5").string(), true); },
                     {"model.h5' holds another model than the config in meta.json",
                      "n_layer: checkpoint 3, config 2", "copied from another checkpoint"});
  test::expect_error([&] { load_checkpoint((work / "swapped_optimizer.h5").string(), true); },
                     {"optimizer.h5' holds", "h.2."});
  // HDF5 files edited in place: another `format`, a tensor saved as a slice of a bigger one, a
  // tensor the model of the attributes does not have (in model.h5, and in a moment group).
  auto edit_h5 = [&](const std::string& name, const char* file, auto&& edit) {
    fs::copy(good, work / name, fs::copy_options::recursive);
    const std::string p = (work / name / file).string();
    h5::H5Id f(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(f.valid());
    edit(f.get());
  };
  edit_h5("other_format", "model.h5", [](hid_t f) {
    ASSERT_GE(H5Adelete(f, "format"), 0);
    ASSERT_TRUE(h5::write_string_attr(f, "format", "something-else"));
  });
  test::expect_error([&] { load_checkpoint((work / "other_format").string(), true); },
                     {"model.h5' has format 'something-else', expected", "not a berth checkpoint"});
  edit_h5("int_format", "model.h5", [](hid_t f) {
    ASSERT_GE(H5Adelete(f, "format"), 0);
    ASSERT_TRUE(h5::write_i64_attr(f, "format", 1));
  });
  test::expect_error([&] { load_checkpoint((work / "int_format").string(), true); },
                     {"model.h5': attribute 'format' is int64, not a string"});
  edit_h5("zero_heads", "model.h5", [](hid_t f) {
    ASSERT_GE(H5Adelete(f, "n_head"), 0);
    ASSERT_TRUE(h5::write_i64_attr(f, "n_head", 0));
  });
  test::expect_error([&] { load_checkpoint((work / "zero_heads").string(), true); },
                     {"zero_heads/model.h5': its attributes (n_layer 2, n_head 0", "corrupt"});
  edit_h5("no_format", "optimizer.h5", [](hid_t f) { ASSERT_GE(H5Adelete(f, "format"), 0); });
  test::expect_error([&] { load_checkpoint((work / "no_format").string(), true); },
                     {"optimizer.h5' has no attribute 'format'"});
  edit_h5("shard", "model.h5", [](hid_t f) {
    h5::H5Id d(H5Dopen2(f, "wpe", H5P_DEFAULT), H5Dclose);
    h5::H5Id attr(H5Aopen(d.get(), "offset", H5P_DEFAULT), H5Aclose);
    const int64_t offset[2] = {16, 0};
    ASSERT_GE(H5Awrite(attr.get(), H5T_NATIVE_INT64, offset), 0);
  });
  test::expect_error([&] { load_checkpoint((work / "shard").string(), true); },
                     {"tensor 'wpe' is not a whole tensor", "offset [16, 0]", "shard"});
  // wpe rewritten as `type` (values 1, converted by HDF5 on write), with berth's attributes.
  auto retype_wpe = [&](const std::string& name, hid_t type) {
    edit_h5(name, "model.h5", [&](hid_t f) {
      hsize_t dims[2] = {0, 0};
      {
        h5::H5Id d(H5Dopen2(f, "wpe", H5P_DEFAULT), H5Dclose);
        h5::H5Id space(H5Dget_space(d.get()), H5Sclose);
        ASSERT_EQ(H5Sget_simple_extent_dims(space.get(), dims, nullptr), 2);
      }
      ASSERT_GE(H5Ldelete(f, "wpe", H5P_DEFAULT), 0);
      h5::H5Id space(H5Screate_simple(2, dims, nullptr), H5Sclose);
      h5::H5Id d(H5Dcreate2(f, "wpe", type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
      const std::vector<float> ones(size_t(dims[0] * dims[1]), 1.f);
      ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, ones.data()), 0);
      const hsize_t two[1] = {2};
      h5::H5Id attr_space(H5Screate_simple(1, two, nullptr), H5Sclose);
      const int64_t full[2] = {int64_t(dims[0]), int64_t(dims[1])}, zero[2] = {0, 0};
      for (const auto& [attr_name, values] : {std::pair{"full_shape", full}, {"offset", zero}}) {
        h5::H5Id attribute(H5Acreate2(d.get(), attr_name, H5T_STD_I64LE, attr_space.get(),
                                      H5P_DEFAULT, H5P_DEFAULT),
                           H5Aclose);
        ASSERT_GE(H5Awrite(attribute.get(), H5T_NATIVE_INT64, values), 0);
      }
    });
  };
  // A tensor of integers (another writer's file) was converted to float on read, without a word.
  retype_wpe("int_tensor", H5T_STD_I32LE);
  test::expect_error([&] { load_checkpoint((work / "int_tensor").string(), true); },
                     {"tensor 'wpe' is stored as a 4-byte non-float",
                      "berth writes IEEE 754 4-byte little-endian floats"});
  // So was a float type header with another exponent bias (one damaged byte): every value read
  // back scaled by a power of two. The data's checksum does not cover the header.
  {
    h5::H5Id biased(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    ASSERT_GE(H5Tset_ebias(biased.get(), 126), 0);
    retype_wpe("biased_float", biased.get());
  }
  test::expect_error(
      [&] { load_checkpoint((work / "biased_float").string(), true); },
      {"tensor 'wpe' is stored as a 4-byte float of another layout", "exponent bias"});
  // model.h5 from another step of the run (copied over this one's): optimizer.h5 was named by
  // its adam_step, model.h5 loaded as this step's weights.
  edit_h5("other_step_weights", "model.h5", [](hid_t f) {
    ASSERT_GE(H5Adelete(f, "step"), 0);
    ASSERT_TRUE(h5::write_i64_attr(f, "step", 7));
  });
  test::expect_error([&] { load_checkpoint((work / "other_step_weights").string(), true); },
                     {"model.h5' holds the weights of step 7, but meta.json says step 10",
                      "copied from another one?"});
  // Checkpoints saved before model.h5 had a step load as before.
  edit_h5("no_step_attr", "model.h5", [](hid_t f) { ASSERT_GE(H5Adelete(f, "step"), 0); });
  EXPECT_EQ(load_checkpoint((work / "no_step_attr").string(), true).meta.step, 10);
  // Values no run saves, in a checkpoint to resume from: refused, naming the tensor (they ended
  // in a NaN loss a step later, blamed on train.lr). Weights-only loads (init_from, export) warn.
  auto poke = [&](const std::string& name, const char* file, const char* tensor, float value) {
    edit_h5(name, file, [&](hid_t f) {
      h5::H5Id d(H5Dopen2(f, tensor, H5P_DEFAULT), H5Dclose);
      h5::H5Id space(H5Dget_space(d.get()), H5Sclose);
      std::vector<float> v(size_t(H5Sget_simple_extent_npoints(space.get())));
      ASSERT_GE(H5Dread(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
      v[3] = value;
      ASSERT_GE(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
    });
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  poke("nan_moment", "optimizer.h5", "m/wpe", nan);
  test::expect_error([&] { load_checkpoint((work / "nan_moment").string(), true); },
                     {"optimizer.h5': tensor 'm/wpe' holds 1 NaN/Inf value(s) (first at element 3",
                      "the checkpoint is corrupt", "resume from an earlier one"});
  poke("negative_v", "optimizer.h5", "v/ln_f.bias", -1.f);
  test::expect_error([&] { load_checkpoint((work / "negative_v").string(), true); },
                     {"tensor 'v/ln_f.bias' holds 1 NaN/Inf or negative value(s)", ": -1)"});
  poke("nan_weight", "model.h5", "ln_f.bias", nan);
  test::expect_error([&] { load_checkpoint((work / "nan_weight").string(), true); },
                     {"model.h5': tensor 'ln_f.bias' holds 1 NaN/Inf value(s)"});
  const CheckpointData weights = load_checkpoint((work / "nan_weight").string(), false);
  const int64_t poked = gpt_param_layout(weights.model).find("ln_f.bias").offset + 3;
  EXPECT_TRUE(std::isnan(weights.params[size_t(poked)]));
  auto add_tensor = [](hid_t loc) {
    const hsize_t dims[1] = {3};
    h5::H5Id space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    h5::H5Id d(H5Dcreate2(loc, "h.9.mlp.c_fc.bias", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose);
    ASSERT_TRUE(d.valid());
  };
  edit_h5("extra", "model.h5", add_tensor);
  test::expect_error([&] { load_checkpoint((work / "extra").string(), true); },
                     {"model.h5' holds 1 tensor(s) the model", "(h.9.mlp.c_fc.bias)", "corrupt"});
  edit_h5("extra_moment", "optimizer.h5", [&](hid_t f) {
    h5::H5Id g(H5Gopen2(f, "v", H5P_DEFAULT), H5Gclose);
    add_tensor(g.get());
  });
  test::expect_error([&] { load_checkpoint((work / "extra_moment").string(), true); },
                     {"optimizer.h5' holds 1 tensor(s)", "(v/h.9.mlp.c_fc.bias)"});
  // Weights only (init_from) does not read optimizer.h5 at all.
  EXPECT_NO_THROW(load_checkpoint((work / "extra_moment").string(), false));
  // A step-N name beyond int64 is no checkpoint name (it threw std::out_of_range).
  fs::create_directories(work / "names" / "step-99999999999999999999");
  std::ofstream((work / "names" / "step-99999999999999999999" / "meta.json").string()) << "{}";
  fs::copy(good, work / "names" / checkpoint_dir_name(10), fs::copy_options::recursive);
  EXPECT_EQ(latest_checkpoint((work / "names").string()),
            (work / "names" / checkpoint_dir_name(10)).string());
}

// A lease's token is claimed in checkpoint.dir when training starts: a holder with a lower token
// can no longer commit there, even before the new holder's first save.
// The byte ranges [begin, end) of the data chunks of datasets `names` in HDF5 file `path`.
std::vector<std::pair<uint64_t, uint64_t>> chunk_bytes(const std::string& path,
                                                       const std::vector<std::string>& names) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  h5::H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  for (const std::string& name : names) {
    h5::H5Id dset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    h5::H5Id space(H5Dget_space(dset.get()), H5Sclose);
    hsize_t n = 0;
    EXPECT_GE(H5Dget_num_chunks(dset.get(), space.get(), &n), 0) << name;
    for (hsize_t i = 0; i < n; ++i) {
      haddr_t addr = 0;
      hsize_t size = 0;
      unsigned mask = 0;
      EXPECT_GE(H5Dget_chunk_info(dset.get(), space.get(), i, nullptr, &mask, &addr, &size), 0);
      out.emplace_back(addr, addr + size);
    }
  }
  return out;
}

// One flipped bit in a checkpoint's HDF5 files is an error that names the file, or changes
// nothing that loads: never other weights or moments. Every 7th byte of their metadata
// (superblock, object headers, chunk index), with the bit rotating, and every 499th byte of their
// data (Fletcher-32 guards it): every metadata byte, one bit each, passed once in 236 s. In the
// HDF5 1.8 format, whose metadata has no checksums, 32 bytes of a model.h5's chunk index read a
// whole tensor back as zeros; a variable-length string attribute (in the unchecksummed global
// heap) hung the reader.
TEST_F(CheckpointTest, AFlippedBitAnywhereIsAnErrorOrChangesNothing) {
  RunConfig cfg = config(2, false);
  const std::string good = trained_checkpoint(cfg);
  const CheckpointData want = load_checkpoint(good, true);
  const fs::path copy = dir_ / "flipped";
  fs::copy(good, copy, fs::copy_options::recursive);
  std::vector<std::string> names, moments;
  for (const ParamSpec& spec : gpt_param_layout(want.model).specs) {
    names.push_back(spec.name);
    moments.push_back("m/" + spec.name);
    moments.push_back("v/" + spec.name);
  }
  for (const auto& [file, datasets] : {std::pair{"model.h5", names}, {"optimizer.h5", moments}}) {
    const std::string p = (copy / file).string();
    const std::string original = read_text_file(p);
    std::vector<char> data(original.size(), 0);
    for (const auto& [begin, end] : chunk_bytes(p, datasets))
      for (uint64_t i = begin; i < end && i < data.size(); ++i) data[i] = 1;
    int64_t tried = 0, refused = 0, metadata = 0;
    std::vector<size_t> silent;
    for (size_t pos = 0; pos < original.size(); ++pos) {
      if (data[pos] ? pos % 499 != 0 : pos % 7 != 0) continue;
      metadata += !data[pos];
      std::string bytes = original;
      bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << (pos / 7 % 8)));
      std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
      ++tried;
      try {
        const bool optimizer = std::string(file) == "optimizer.h5";
        const CheckpointData got = load_checkpoint(copy.string(), optimizer);
        if (got.params != want.params || got.meta.step != want.meta.step ||
            (optimizer && (got.adam_m != want.adam_m || got.adam_v != want.adam_v ||
                           got.adam_step != want.adam_step))) {
          silent.push_back(pos);
        }
      } catch (const Error& e) {
        ++refused;
        EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << pos << ": " << e.what();
        // A damaged berth checkpoint, not another file: "not a berth checkpoint file" sent the
        // user after a mix-up (a failed attribute lookup was read as an absent one).
        EXPECT_EQ(std::string(e.what()).find("not a berth checkpoint"), std::string::npos)
            << file << " byte " << pos << ": " << e.what();
      }
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << original;
    EXPECT_TRUE(silent.empty()) << file << ": " << silent.size() << " flips loaded other values, "
                                << "the first at byte " << (silent.empty() ? 0 : silent[0]);
    // most flips are caught: a few land in bytes nothing reads (padding, free space)
    EXPECT_GT(refused, tried * 3 / 4) << file;
    std::printf("%s: %zu bytes, %ld of metadata; %ld flips tried, %ld refused\n", file,
                original.size(), static_cast<long>(metadata), static_cast<long>(tried),
                static_cast<long>(refused));
  }
}

TEST_F(CheckpointTest, AClaimedFenceRefusesLowerTokens) {
  RunConfig cfg = config(10, false);
  CheckpointData ck = load_checkpoint(trained_checkpoint(cfg), true);
  const fs::path fenced = dir_ / "fenced";
  fs::create_directories(fenced);
  claim_checkpoint_fence(fenced.string(), 2);
  ck.meta.fencing_token = 1;
  test::expect_error([&] { save_checkpoint((fenced / checkpoint_dir_name(10)).string(), ck); },
                     {"checkpoint commit refused", "token 2 already committed",
                      "restored from a backup", "remove " + (fenced / "FENCE").string()});
  EXPECT_FALSE(fs::exists(fenced / checkpoint_dir_name(10)));
  ck.meta.fencing_token = 2;
  save_checkpoint((fenced / checkpoint_dir_name(10)).string(), ck);
  EXPECT_TRUE(fs::exists(fenced / checkpoint_dir_name(10) / "meta.json"));
  test::expect_error([&] { claim_checkpoint_fence(fenced.string(), 1); }, {"token 2 already"});
}

TEST_F(CheckpointTest, SaveNeverOverwritesAndLeavesNothingOnFailure) {
  RunConfig cfg = config(10, false);
  const std::string good = trained_checkpoint(cfg);
  CheckpointData ck = load_checkpoint(good, true);
  test::expect_error([&] { save_checkpoint(good, ck); }, {"already exists"});
  ck.adam_m.resize(3);  // inconsistent state: refused before anything is written
  const std::string bad = (dir_ / "bad").string();
  test::expect_error([&] { save_checkpoint(bad, ck); }, {"optimizer moments do not match"});
  EXPECT_FALSE(fs::exists(bad));
}

}  // namespace
}  // namespace berth
