#include "runtime/train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "kernels/backend.h"
#include "packing/cp_shard.h"
#include "packing/plan_cache.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "runtime/comm/nccl.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fnv.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/lease_keeper.h"
#include "runtime/train/packed_loader.h"
#include "runtime/train/preflight.h"
#include "runtime/train/progress_tracker.h"
#include "runtime/train/resume_changes.h"
#include "runtime/train/run_dir_lock.h"
#include "runtime/train/step_metrics.h"
#include "runtime/train/stop_signals.h"

namespace berth {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void sleep_seconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// How the model's attention runs on this backend at this head size (the log's model line).
const char* attention_path(const Backend& be, int head_size) {
  if (!be.prefers_flash_attention()) return "attention through its probabilities (BLAS)";
  return be.attention_on_tensor_cores(head_size) ? "flash-style attention on tensor cores (bf16)"
                                                 : "flash-style attention in fp32";
}

std::string describe_layers(int L, int pp, int stage) {
  const LayerRange r = stage_layers(L, pp, stage);
  return fmt::format("{}..{}", r.begin, r.end - 1);
}

// One pipeline stage of a step (or of an evaluation) for the executor: micro-batch m runs on the
// model with the activations of a slot taken at its first forward-side action and given back
// after its backward, so a stage never holds more than its schedule's micro-batches in flight.
class StageRunner final : public PipelineStage {
 public:
  StageRunner(GPT<float>& model, std::vector<const PackedBatch*> batches, float dloss, bool train)
      : model_(model), batches_(std::move(batches)), dloss_(dloss), train_(train) {
    for (int s = model.slots() - 1; s >= 0; --s) free_.push_back(s);
    slot_.assign(batches_.size(), -1);
  }
  double loss_sum() const { return loss_sum_; }

  void forward(int m) override { loss_sum_ += model_.forward(batch(m), slot_of(m)); }
  void backward(int m) override {
    model_.backward(batch(m), dloss_, slot_of(m));
    free_.push_back(slot_[size_t(m)]);
    slot_[size_t(m)] = -1;
  }
  float* recv_activation(int m) override { return model_.stage_input(slot_of(m)); }
  const float* send_activation(int m) override { return model_.stage_output(slot_of(m)); }
  float* recv_grad(int) override { return model_.output_grad(); }
  const float* send_grad(int) override { return model_.input_grad(); }
  size_t activation_count(int m) override {
    return size_t(batch(m).N()) * size_t(model_.config().C);
  }

 private:
  const PackedBatch& batch(int m) const { return *batches_[size_t(m)]; }
  int slot_of(int m) {
    if (!train_) return 0;  // forward only: one micro-batch at a time
    int& s = slot_[size_t(m)];
    if (s < 0) {
      BERTH_CHECK(!free_.empty(), "pipeline: micro-batch {} needs an activation slot and all {} "
                  "are in use (the schedule holds more micro-batches than the model was sized for)",
                  m, model_.slots());
      s = free_.back();
      free_.pop_back();
    }
    return s;
  }

  GPT<float>& model_;
  std::vector<const PackedBatch*> batches_;
  float dloss_;
  bool train_;
  std::vector<int> slot_, free_;
  double loss_sum_ = 0;
};

// Σ g² over the elements [begin, end) of a flat gradient buffer (g holds element `begin` first)
// that belong to tensors this rank holds uniquely (ParamSpec::unique).
double unique_sum_squares(Backend& be, const ParamLayout& layout, const float* g, int64_t begin,
                          int64_t end) {
  bool all_unique = true;
  for (const ParamSpec& s : layout.specs) all_unique = all_unique && s.unique;
  if (all_unique) return be.sum_squares(g, end - begin);
  double sum = 0;
  for (const ParamSpec& s : layout.specs) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (s.unique && lo < hi) sum += be.sum_squares(g + (lo - begin), hi - lo);
  }
  return sum;
}

// The step of a line of metrics.jsonl; none for a line that is not a step record (empty, or cut
// short by a run killed while writing it).
std::optional<int64_t> record_step(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<int64_t>();
}

// The steps after the first of `kept` up to `last` that `kept` lacks, as ranges ("10..20, 33"; the
// first 5 ranges, then how many more); empty when none are.
std::string missing_steps(std::vector<int64_t> kept, int64_t last) {
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  if (kept.empty()) return "";
  kept.push_back(last + 1);  // a missing tail ends at `last`
  std::vector<std::string> ranges;
  for (size_t i = 1; i < kept.size(); ++i) {
    const int64_t lo = kept[i - 1] + 1, hi = kept[i] - 1;
    if (lo > hi) continue;
    ranges.push_back(lo == hi ? fmt::format("{}", lo) : fmt::format("{}..{}", lo, hi));
  }
  if (ranges.size() > 5) {
    const size_t more = ranges.size() - 5;
    ranges.resize(5);
    ranges.push_back(fmt::format("and {} more range(s)", more));
  }
  return fmt::format("{}", fmt::join(ranges, ", "));
}

// The last step recorded in a metrics.jsonl (its records are in step order: read from the end);
// none when the file is missing or holds no step record.
std::optional<int64_t> last_recorded_step(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::string text = read_text_file(path);
  for (size_t end = text.size(); end > 0;) {
    const size_t nl = text.rfind('\n', end - 1);
    const size_t begin = nl == std::string::npos ? 0 : nl + 1;
    if (const std::optional<int64_t> step = record_step(text.substr(begin, end - begin)))
      return step;
    if (nl == std::string::npos) break;
    end = nl;
  }
  return std::nullopt;
}

}  // namespace

void check_dataset_fits(const TokenDataset& ds, const char* key, const RunConfig& cfg) {
  const std::string& path = std::string(key) == "data.val" ? cfg.data.val : cfg.data.train;
  BERTH_CHECK(ds.vocab_size <= cfg.model.vocab_size,
              "{} '{}' has vocab_size {} but model.vocab_size is {}: raise model.vocab_size "
              "to at least {}",
              key, path, ds.vocab_size, cfg.model.vocab_size, ds.vocab_size);
  // A stream window is seq_len + 1 tokens; packed and padded rows take documents of any length
  // (a short data.val fills its rows with padding).
  const bool stream = cfg.data.mode == "stream";
  BERTH_CHECK(ds.n_tokens() >= (stream ? cfg.data.seq_len + 1 : 2),
              "{} '{}' has {} tokens, fewer than {}: {}", key, path, ds.n_tokens(),
              stream ? fmt::format("data.seq_len + 1 = {} (one window of data.mode = \"stream\")",
                                   cfg.data.seq_len + 1)
                     : std::string("2 (a token to predict from another)"),
              stream ? fmt::format("lower data.seq_len or give a bigger {}", key)
                     : fmt::format("give a bigger {}", key));
  if (!ds.loss_mask.empty()) {
    // The mask applies to a document's targets: its tokens after the first (a first token is a
    // target only as the EOT that ends the document before it, which a document's own targets
    // decide nothing about here).
    bool any_target = false;
    for (int64_t d = 0; d < ds.n_docs() && !any_target; ++d) {
      for (uint64_t i = ds.doc_offsets[size_t(d)] + 1; i < ds.doc_offsets[size_t(d) + 1]; ++i) {
        if (ds.loss_mask[i] != 0) {
          any_target = true;
          break;
        }
      }
    }
    BERTH_CHECK(cfg.data.mode == "stream" || any_target,
                "{} '{}': its /loss_mask is 0 for every target token, so there is nothing to "
                "train or evaluate on; check how the dataset was made (1 = train on the token)",
                key, path);
    if (cfg.data.mode == "stream" && identity_rank() <= 0) {  // once, not from every rank
      log_warn(
          "{} '{}' has a /loss_mask, which data.mode = \"stream\" does not apply (it trains "
          "on every token); use data.mode = \"packed\" or \"padded\" for prompt masking",
          key, path);
    }
  }
  if (cfg.data.mode != "stream" && cfg.data.long_docs == "drop") {
    bool any_kept = false;
    for (int64_t d = 0; d < ds.n_docs() && !any_kept; ++d) {
      const uint64_t len = ds.doc_offsets[size_t(d) + 1] - ds.doc_offsets[size_t(d)];
      any_kept = len > 0 && int64_t(len) <= cfg.data.seq_len;
    }
    BERTH_CHECK(any_kept,
                "every document of {} '{}' is longer than data.seq_len ({}) and data.long_docs "
                "= \"drop\" drops them: nothing would be left; use \"split\" or a larger seq_len",
                key, path, cfg.data.seq_len);
  }
}

namespace {

// How many ranks hold another `text` than rank 0 and, when any do, rank 0's text and that of the
// highest such rank, on every rank (compared by hash, sent whole only when they differ).
// Collective.
struct TextMismatch {
  int64_t ranks = 0, last = -1;
  std::string first, other;
};
TextMismatch compare_with_rank0(Communicator& world, const std::string& text) {
  TextMismatch m;
  const int64_t mine = int64_t(std::hash<std::string>{}(text));
  int64_t first = mine;
  world.broadcast(&first, 1, DType::I64, 0);
  m.ranks = world.all_reduce_value<int64_t>(mine != first ? 1 : 0, ReduceOp::SUM);
  if (m.ranks == 0) return m;
  m.last = world.all_reduce_value<int64_t>(mine != first ? world.rank() : -1, ReduceOp::MAX);
  m.first = world.broadcast_text(text, 0);
  m.other = world.broadcast_text(text, static_cast<int>(m.last));
  return m;
}

// A missing dataset named by its key; a relative path is read from the current directory (a
// batch script's, not the config's), which the message says.
void require_data_file(const std::string& path, const char* key) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return;
  const bool relative = std::filesystem::path(path).is_relative();
  BERTH_FAIL(
      "{} '{}' does not exist{}; fix the path, or create the dataset with `berth data "
      "import`",
      key, path,
      relative ? fmt::format(" (a relative path is read from the current directory, {}, "
                             "not from the config's)",
                             std::filesystem::current_path(ec).string())
               : "");
}

// Before anything big is allocated on the host: a config whose plan (berth plan) needs more memory
// per rank than this whole host has ends in the allocator's out-of-memory naming nothing
// (parallel.microbatches = 2e9 asked for 11 TiB of batches). The plan is an estimate, so only a
// need beyond the host itself (its share for each of the `ranks_here` ranks it runs: they share
// it) is refused.
void require_plan_fits_host(const Plan& p, const RunConfig& cfg, const std::string& where,
                            int ranks_here) {
  constexpr double kGiB = 1073741824.0;
  const double host = host_capacity_gib_per_rank(ranks_here) * kGiB;
  const bool save = p.save_share_bytes > p.peak.total();
  const double need = save ? p.save_share_bytes : p.peak.total();
  BERTH_CHECK(host <= 0 || need <= host,
              "{}: berth plan predicts {} per rank {}, more than {} ({}): the run "
              "would fail allocating it. See `berth plan {}` for where it goes and for layouts "
              "that fit (smaller parallel.microbatches or train.micro_batch_size, more ranks, pp "
              "or tp)",
              where, format_bytes(need),
              save ? fmt::format("during a checkpoint save (peak {} on stage {}, and the whole "
                                 "tensors the save gathers)",
                                 format_bytes(p.peak.total()), p.peak_stage)
                   : fmt::format("at peak (stage {})", p.peak_stage),
              ranks_here > 1
                  ? fmt::format("this host has for each of the {} ranks it runs", ranks_here)
                  : std::string("this whole host has"),
              format_bytes(host), cfg.source.empty() ? "CONFIG" : cfg.source);
}

// A directory whose files would be longer than the system allows failed only when first
// written: a checkpoint.dir of 4060 characters passed the start, trained to its first save and
// failed there ("File name too long"). `longest` is the longest name a run writes below `dir`.
void require_paths_fit(const std::string& dir, const std::string& longest, const char* key) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(dir, ec);
  const size_t n = (ec ? dir : abs.string()).size() + 1 + longest.size();
  BERTH_CHECK(n < PATH_MAX,
              "{} is {} characters long: a run writes {} there, a path of {} characters, past "
              "this system's limit of {} (PATH_MAX); choose a shorter {}",
              key, (ec ? dir : abs.string()).size(), longest, n, PATH_MAX - 1, key);
}

// How many of `world`'s ranks run on this host (by host name). Collective over `world`: a CPU
// trainer may run on a sub-communicator, where mpi_local_rank (over MPI_COMM_WORLD) would wait
// for ranks that never come.
int ranks_on_this_host(Communicator& world) {
  if (world.size() == 1) return 1;
  const int64_t mine = int64_t(std::hash<std::string>{}(host_name()) >> 1);
  std::vector<int64_t> all(size_t(world.size()));
  world.all_gather(&mine, all.data(), std::vector<size_t>(size_t(world.size()), 1), DType::I64);
  return int(std::count(all.begin(), all.end(), mine));
}

// Every rank read the same data.train: the path is the same string everywhere (the configs were
// compared), but on hosts without a shared file system each reads its own copy, and a stale or
// partial one trained other rows than the checkpoints and the other ranks assume. Collective.
void require_same_data_on_every_rank(Communicator& world, const std::string& fingerprint,
                                     const std::string& path) {
  Fnv1a h;
  h.bytes(fingerprint.data(), fingerprint.size());
  const int64_t mine = static_cast<int64_t>(h.h >> 1);  // non-negative, so -mine is too
  const int64_t most = world.all_reduce_value(mine, ReduceOp::MAX);
  const int64_t least = -world.all_reduce_value(-mine, ReduceOp::MAX);
  BERTH_CHECK(most == least,
              "data.train '{}' is not the same file on every rank (this rank's: {}): copy the "
              "same dataset to every node, or put it on a shared file system",
              path, fingerprint);
}

// A validation set tokenized otherwise than the training set gives losses of another problem.
void check_same_tokenizer(const TokenDataset& train, const TokenDataset& val,
                          const RunConfig& cfg) {
  BERTH_CHECK(train.tokenizer == val.tokenizer && train.eot_token == val.eot_token &&
                  train.vocab_size == val.vocab_size,
              "data.val '{}' is tokenized as '{}' (eot {}, vocab_size {}), data.train '{}' as "
              "'{}' (eot {}, vocab_size {}): its losses would not measure this model; give a "
              "data.val made with the same tokenizer",
              cfg.data.val, val.tokenizer, val.eot_token, val.vocab_size, cfg.data.train,
              train.tokenizer, train.eot_token, train.vocab_size);
}

}  // namespace

void check_data_files(const RunConfig& cfg) {
  require_data_file(cfg.data.train, "data.train");
  // data.val is read only when something evaluates: with eval.interval = 0 a config's val path
  // (on another cluster, not yet made) neither stops the run nor takes memory.
  if (cfg.eval.interval > 0 && !cfg.data.val.empty()) require_data_file(cfg.data.val, "data.val");
  if (cfg.data.mode != "stream" && !cfg.data.pack_plan.empty()) {
    require_named_plan_is_this_runs(cfg, pack_options(cfg, int(cfg.parallel.cp)));
  }
}

GridShape check_layout(const RunConfig& cfg, int world) {
  const std::string where = cfg.source.empty() ? "config" : cfg.source;
  const GridShape shape =
      resolve_grid(GridRequest{cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.dp},
                   world, cfg.model.n_head, cfg.model.n_layer);
  for (const auto& [name, rank] : {std::pair{"debug.fail_rank", cfg.debug.fail_rank},
                                   {"debug.slow_rank", cfg.debug.slow_rank}}) {
    BERTH_CHECK(rank < world,
                "{}: {} = {} is not a rank of this job ({} ranks): the fault would never fire",
                where, name, rank, world);
  }
  const int64_t cp = shape.cp, T = cfg.data.seq_len;
  if (cp > 1) {
    BERTH_CHECK(T % (2 * cp) == 0,
                "{}: parallel.cp = {} needs data.seq_len divisible by 2·cp = {} (got {}): each "
                "row splits into 2·cp chunks",
                where, cp, 2 * cp, T);
    BERTH_CHECK(cfg.data.mode == "stream" || cfg.data.pack_align == 0 ||
                    cfg.data.pack_align % (2 * cp) == 0,
                "{}: data.pack_align = {} with parallel.cp = {}: it must be a multiple of 2·cp = "
                "{} (or 0 for automatic)",
                where, cfg.data.pack_align, cp, 2 * cp);
  }
  return shape;
}

Trainer::Trainer(const RunConfig& cfg, Communicator& world, Backend* backend,
                 const std::string& resume)
    : cfg_(cfg), world_(world) {
  heap_baseline_ = heap_in_use_bytes();
  require_same_config_on_every_rank();
  validate_config(cfg_);
  const std::string where = cfg_.source.empty() ? "config" : cfg_.source;
  check_data_settings(cfg_);
  // The layout is checked before anything is allocated.
  const GridShape shape = check_layout(cfg_, world.size());
  // A launch on a live run's directory is refused before it loads data and builds a model (which
  // takes minutes for big ones), and before it reads checkpoints that run may be pruning. A run
  // directory made later (run()) is locked there.
  run_dir_ = (std::filesystem::path(cfg_.run.out_dir) / cfg_.run.name).string();
  checkpoint_dir_ = cfg_.checkpoint.dir.empty() ? run_dir_ + "/checkpoints" : cfg_.checkpoint.dir;
  std::error_code dir_ec;
  if (world_.rank() == 0 && std::filesystem::is_directory(run_dir_, dir_ec)) lock_run_dir();
  // So is a launch on the checkpoint.dir of another live run (another run.name pointed at it):
  // before a resume reads it and before run() weighs what it holds.
  if (world_.rank() == 0 && std::filesystem::is_directory(checkpoint_dir_, dir_ec)) {
    lock_checkpoint_dir();
  }
  // The pre-flight plan of this config on this machine (berth plan): checked here against the
  // host on the CPU, logged by run() and set beside the measured figures at its end. A plan that
  // cannot be made is a notice only. It packs nothing (the loaders do, next; rank 0 plans again
  // from their plans then, for the step time).
  // A calibrated CPU profile of another rank count per host gets this run's memory share, and a
  // warning (a 1-rank run under a 4-rank profile was planned at a quarter of the memory).
  const int ranks_here = ranks_on_this_host(world);
  std::string sharing;
  try {
    preflight_ =
        make_plan(plan_input_from_config(cfg_, world.size(), false),
                  profile_for_ranks_here(resolve_hardware_profile("cpu"), ranks_here, &sharing));
  } catch (const Error& e) {
    preflight_error_ = e.what();
  }
  if (preflight_ && cfg_.run.device == "cpu" && world_.rank() == 0 && !sharing.empty()) {
    log_warn("{} ({})", sharing, default_profile_path());
  }
  if (preflight_ && cfg_.run.device == "cpu") {
    require_plan_fits_host(*preflight_, cfg_, where, ranks_here);
  }
  // The device (run.device): every rank the same kind. A GPU is picked by the rank's place on
  // its host (a collective over MPI_COMM_WORLD: a trainer on a GPU spans the world). With CUDA
  // the grid's groups are NCCL communicators over the same ranks (the model's buffers are on the
  // device); host-side control stays on `world`.
  if (backend != nullptr) {
    BERTH_CHECK(backend->kind() == DeviceKind::kCpu,
                "a backend given to the trainer must be on host memory (tests), not {}",
                backend->name());
    backend_ = backend;
  } else if (cfg_.run.device == "cpu") {
    own_backend_ = make_cpu_backend();
  } else {
    const LocalRank local = mpi_local_rank();
    own_backend_ = make_backend(cfg_.run.device, local.rank, local.size);
    if (own_backend_->kind() == DeviceKind::kCuda && !nccl_built()) {
      BERTH_CHECK(cfg_.run.device == "auto",
                  "{}: run.device = \"cuda\" needs the NCCL communicator, which this berth was "
                  "built without (install NCCL where CUDA is and rebuild)",
                  where);
      log_warn("run.device = \"auto\": a GPU is visible but this berth has no NCCL; training "
               "on the CPU");
      own_backend_ = make_cpu_backend();
    }
  }
  if (backend_ == nullptr) backend_ = own_backend_.get();
  backend_->set_matmul_precision(parse_matmul_precision(cfg_.run.precision));
  const bool cuda = backend_->kind() == DeviceKind::kCuda;
  BERTH_CHECK(cfg_.run.device == "cpu" ||
                  world.all_reduce_value(int(cuda), ReduceOp::SUM) % world.size() == 0,
              "{}: run.device = \"{}\" found a GPU on some ranks only; set run.device = \"cuda\" "
              "or \"cpu\" explicitly",
              where, cfg_.run.device);
  if (cuda) device_world_ = make_nccl_world(*backend_);
  grid_ = std::make_unique<ProcessGrid>(cuda ? *device_world_ : world, shape);
  // Checkpoints hold the model at the plain padding (128); a TP run pads to 128·tp.
  canonical_ = make_gpt_config(cfg_.model.n_layer, cfg_.model.n_head, cfg_.model.d_model,
                               cfg_.model.vocab_size, cfg_.model.max_seq_len);
  gcfg_ = make_gpt_config(cfg_.model.n_layer, cfg_.model.n_head, cfg_.model.d_model,
                          cfg_.model.vocab_size, cfg_.model.max_seq_len, 128 * shape.tp);
  const GridCoord& at = grid_->coord();
  shard_ = ModelShard{shape.tp, at.tp, shape.pp, at.pp};
  const int M = int(cfg_.parallel.microbatches);
  train_actions_ = cfg_.parallel.schedule == "afab" ? schedule_afab(shape.pp, at.pp, M)
                                                    : schedule_1f1b(shape.pp, at.pp, M);
  if (shape.pp > 1 && cfg_.parallel.schedule == "1f1b" && M < shape.pp && world_.rank() == 0) {
    log_warn("parallel.microbatches = {} < pp = {}: the pipeline is idle for most of each step "
             "(bubble (pp − 1)/(M + pp − 1) = {:.0f} %); raise parallel.microbatches to at least "
             "{}",
             M, shape.pp, 100.0 * (shape.pp - 1) / double(M + shape.pp - 1), 4 * shape.pp);
  }
  schedule_ = parse_lr_schedule(cfg_.train.lr_schedule);
  const TrainSection& tr = cfg_.train;
  if (tr.warmup_steps > tr.steps && world_.rank() == 0) {
    log_warn(
        "train.warmup_steps = {} > train.steps = {}: the learning rate never reaches "
        "train.lr = {:g} (the last step uses {:g}); lower train.warmup_steps to at most {}",
        tr.warmup_steps, tr.steps, tr.lr,
        lr_at(tr.steps - 1, tr.steps, tr.lr, tr.min_lr, tr.warmup_steps, schedule_), tr.steps);
  }
  const int B = int(cfg_.train.micro_batch_size), T = int(cfg_.data.seq_len);
  // Context parallelism: each rank runs the model on its zigzag half-chunks of every row.
  const int cp = shape.cp;
  // data.val is read only when something evaluates: with eval.interval = 0 a config's val path
  // (on another cluster, not yet made) neither stops the run nor takes memory.
  const bool reads_val = cfg_.eval.interval > 0 && !cfg_.data.val.empty();
  check_data_files(cfg_);
  train_ds_ = read_token_dataset(cfg_.data.train);
  check_dataset_fits(train_ds_, "data.train", cfg_);
  data_fingerprint_ = dataset_fingerprint(train_ds_);
  require_same_data_on_every_rank(world, data_fingerprint_, cfg_.data.train);
  loader_ = make_loader(&train_ds_, cfg_.data.train, false);
  // Fewer rows than one step takes: every step repeats rows (allowed, as a tiny test set must
  // train, but a real run that does this was given the wrong file).
  if (const int64_t step_rows =
          grid_->shape().dp * cfg_.parallel.microbatches * cfg_.train.micro_batch_size;
      world_.rank() == 0 && loader_->rows_per_epoch() < step_rows) {
    log_warn(
        "data.train '{}' holds {} rows of {} tokens, fewer than one step takes ({} rows: dp {} × "
        "microbatches {} × micro_batch_size {}): every step repeats rows. Check data.train, or "
        "lower train.micro_batch_size",
        cfg_.data.train, loader_->rows_per_epoch(), T, step_rows, grid_->shape().dp,
        cfg_.parallel.microbatches, cfg_.train.micro_batch_size);
  }
  if (reads_val) {
    val_ds_ = read_token_dataset(cfg_.data.val);
    check_dataset_fits(val_ds_, "data.val", cfg_);
    check_same_tokenizer(train_ds_, val_ds_, cfg_);
    val_loader_ = make_loader(&val_ds_, cfg_.data.val, true);
    // An evaluation holds its batches in memory and reads the validation windows from the start:
    // more batches than one pass over data.val takes only repeat windows (weighting them twice)
    // and grow memory (eval.batches = 20000000 took 14 GB before evaluating anything).
    const int64_t rows = grid_->shape().dp * cfg_.train.micro_batch_size;
    const int64_t one_pass = val_loader_->rows_per_epoch() / rows;  // whole batches only
    BERTH_CHECK(one_pass > 0,
                "data.val '{}' holds {} rows, fewer than one global batch of {} (dp {} × "
                "micro_batch_size {}): give a bigger data.val, or lower train.micro_batch_size",
                cfg_.data.val, val_loader_->rows_per_epoch(), rows, grid_->shape().dp,
                cfg_.train.micro_batch_size);
    BERTH_CHECK(cfg_.eval.batches <= one_pass,
                "eval.batches = {} asks for {} validation rows ({} global batches of dp {} × "
                "micro_batch_size {}), but data.val '{}' holds {} rows: windows would repeat. "
                "Lower eval.batches to at most {} (the whole validation set), or give a bigger "
                "data.val",
                cfg_.eval.batches, cfg_.eval.batches * rows, cfg_.eval.batches, grid_->shape().dp,
                cfg_.train.micro_batch_size, cfg_.data.val, val_loader_->rows_per_epoch(),
                one_pass);
  }

  // Packed and padded rows: rank 0's plan again, with the attention work and fill of the packing
  // plan its loader holds (memory does not change).
  if (const auto* packed = dynamic_cast<const PackedLoader*>(loader_.get());
      preflight_ && packed != nullptr && world_.rank() == 0) {
    PlanInput in = preflight_->input;
    set_row_packing(&in, packed->plan());
    preflight_ = make_plan(in, preflight_->hw);
  }

  model_ = std::make_unique<GPT<float>>(gcfg_, B, T / cp, shard_, &grid_->tp(),
                                        max_in_flight(train_actions_), backend_);
  model_->init_weights(uint64_t(cfg_.run.seed));
  model_->set_context_parallel(&grid_->cp());
  cp_batches_.resize(size_t(cfg_.parallel.microbatches));
  AdamWSettings s;
  s.beta1 = cfg_.train.beta1;
  s.beta2 = cfg_.train.beta2;
  s.eps = cfg_.train.eps;
  s.weight_decay = cfg_.train.weight_decay;
  s.grad_clip = cfg_.train.grad_clip;
  ShardRange range{0, model_->layout().total};
  if (cfg_.parallel.zero == 1) {
    Communicator& g = grid_->dp_cp();
    shard_counts_ = shard_counts(model_->layout().total, g.size());
    range = shard_range(model_->layout().total, g.size(), g.rank());
    shard_grads_ = DeviceBuffer<float>(model_->backend(), range.size());
  }
  opt_ = std::make_unique<AdamW>(model_->layout(), s, range, &model_->backend());
  flops_per_token_ = gpt_flops_per_token(canonical_, T);
  batches_.resize(size_t(cfg_.parallel.microbatches));
  for (PackedBatch& b : batches_) reset_rows(&b, B, T);
  // The validation windows every evaluation reads: without a target among them (a /loss_mask
  // that is 0 there) the val loss is 0/0, which vanished from the log and metrics.jsonl.
  if (val_loader_) {
    load_eval_batches();
    const int64_t most = val_loader_->rows_per_epoch() / (grid_->shape().dp * B);
    BERTH_CHECK(eval_targets_ > 0,
                "the {} validation batches an evaluation reads (eval.batches × dp {} × "
                "micro_batch_size {} rows from the start of data.val '{}') hold no target token "
                "({}), so the val loss is undefined; {}",
                cfg_.eval.batches, grid_->shape().dp, cfg_.train.micro_batch_size, cfg_.data.val,
                val_ds_.loss_mask.empty() ? "their documents are single tokens"
                                          : "its /loss_mask is 0 there, or their documents are "
                                            "single tokens",
                cfg_.eval.batches < most
                    ? fmt::format("raise eval.batches (up to {}, the whole of data.val), or "
                                  "check how data.val was made",
                                  most)
                    : std::string("data.val holds no target at all in these modes: check how "
                                  "it was made"));
  }
  // Every rank resumes as rank 0 does: one launched with --resume and another without (an MPMD
  // launch, a wrapper that adds it on some hosts) would wait in different collectives until the
  // watchdog blamed a peer, 10 minutes later by default.
  if (const TextMismatch m = compare_with_rank0(world_, resume); m.ranks > 0) {
    auto shown = [](const std::string& r) { return r.empty() ? "none" : "'" + r + "'"; };
    BERTH_FAIL(
        "{} of the {} ranks were launched with another --resume than rank 0 (rank 0: {}; rank "
        "{}: {}): every rank must get the same --resume",
        m.ranks, world_.size(), shown(m.first), m.last, shown(m.other));
  }
  if (!resume.empty()) this->resume(resume);
  if (start_step_ == 0) load_init_from();
}

void Trainer::load_init_from() {
  if (cfg_.model.init_from.empty()) return;
  const auto t_load = std::chrono::steady_clock::now();
  CheckpointData ck;
  try {
    ck = load_checkpoint(cfg_.model.init_from, false);
  } catch (const Error& e) {
    BERTH_FAIL("model.init_from: {}", e.what());
  }
  const std::string diff = describe_shape_mismatch(ck.model, gcfg_);
  BERTH_CHECK(diff.empty(),
              "model.init_from '{}' does not fit this model: {}; set model.* to "
              "the checkpoint's shape",
              cfg_.model.init_from, diff);
  model_->set_params(local_from_full(ck.params, ck.model));
  log_info("init_from {}: weights loaded in {:.2f} s (fresh optimizer, step 0)",
           cfg_.model.init_from, seconds_since(t_load));
}

std::unique_ptr<BatchSource> Trainer::make_loader(const TokenDataset* ds, const std::string& path,
                                                  bool eval) {
  const bool shuffle = !eval && cfg_.data.shuffle;
  const uint64_t seed = eval ? 0 : uint64_t(cfg_.run.seed);
  const int B = int(cfg_.train.micro_batch_size), T = int(cfg_.data.seq_len);
  const StreamLoader::Shard shard{grid_->coord().dp, grid_->shape().dp};
  if (cfg_.data.mode == "stream") {
    auto loader = std::make_unique<StreamLoader>(ds, B, T, shuffle, seed, shard);
    if (data_summary_.empty()) {
      data_summary_ = fmt::format("stream: {} windows of {} (+1) tokens{}", loader->n_windows(), T,
                                  shuffle ? ", shuffled" : "");
    }
    return loader;
  }
  // packed / padded: the plan is cached next to the dataset, keyed by a hash of the document
  // offsets and every packing option; a matching plan is reused, a stale one rebuilt. Rank 0
  // builds or checks it; the others read it (or, where the cache cannot be written, pack the
  // same plan themselves: it is a pure function of the lengths and options).
  const PackOptions o =
      eval ? eval_pack_options(cfg_, grid_->shape().cp) : pack_options(cfg_, grid_->shape().cp);
  const std::string cache = packed_plan_path(cfg_, path, o, eval);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> lengths = document_lengths(*ds);
  PackPlan plan;
  bool reused = false;
  int32_t cached = 0;  // rank 0's outcome: 1 = plan cached, 0 = packing in memory, -1 = refused
  std::string refused;
  if (world_.rank() == 0) {
    try {
      require_plan_destination(cache);  // a file that is not a plan: the config's mistake
      // A plan path the config names, not there yet, is where the plan must go: a missing or
      // read-only directory there is the config's mistake (a typo), not a cache to skip.
      std::error_code ec;
      // (One there packed for other options was refused by check_data_files.)
      if (!eval && path == cfg_.data.train && !cfg_.data.pack_plan.empty() &&
          !std::filesystem::exists(cache, ec)) {
        check_output_file(cache, "data.pack_plan", "pack_plan.h5");
      }
      try {
        plan = load_or_build_plan(cache, ds->doc_offsets, o, &reused);
        cached = 1;
      } catch (const Error& e) {
        log_warn("cannot cache the packing plan as {} ({}); packing in memory", cache, e.what());
      }
    } catch (const Error& e) {
      refused = e.what();
      cached = -1;
    }
  }
  world_.broadcast(&cached, 1, DType::I32, 0);
  if (cached == -1) {
    BERTH_FAIL("{}", world_.rank() == 0 ? refused
                                        : fmt::format("rank 0 refused the packing plan path {} "
                                                      "(its error says why)",
                                                      cache));
  }
  if (world_.rank() != 0 || cached == 0) {
    if (cached == 1) {
      std::string key;
      plan = read_plan(cache, &key);
      BERTH_CHECK(key == plan_key(ds->doc_offsets, o),
                  "packing plan {} changed while this run started; start again", cache);
    } else {
      plan = pack_documents(lengths, o);
    }
  }
  const double seconds =
      seconds_since(t0);
  if (reused) log_info("packing: reusing the plan {} (same data and options)", cache);
  const PackStats st = pack_stats(plan, lengths);
  if (data_summary_.empty()) {
    data_summary_ = fmt::format("{} ({}) of '{}': {}", cfg_.data.mode,
                                pack_algorithm_name(o.algorithm), path,
                                format_pack_stats(st, seconds));
  }
  return std::make_unique<PackedLoader>(ds, std::move(plan), B, T, shuffle, seed, shard);
}

void Trainer::resume(const std::string& spec) {
  // Rank 0 (the writer) resolves `auto` and every rank loads that checkpoint: with checkpoint.dir
  // on each host's own disk, the other hosts would find nothing and start afresh.
  std::string path = spec;
  if (spec == "auto") {
    std::string latest, refusal;
    if (world_.rank() == 0) {
      latest = latest_checkpoint(checkpoint_dir_).value_or("");
      // A newer step directory without meta.json (emptied or partly copied by hand) is passed
      // by: say so, or the run silently goes back past it. One where this run will save would
      // fail that save (run() refuses it): said now, before a resume is announced.
      const int64_t latest_step = latest.empty() ? -1 : checkpoint_step(latest);
      const std::string older = latest.empty() ? std::string("no complete checkpoint is older")
                                               : "the newest complete one is " + latest;
      std::vector<std::string> passed;
      for (const auto& [step, dir] : incomplete_checkpoints(checkpoint_dir_)) {
        if (step <= latest_step) continue;
        if (step <= cfg_.train.steps && saves_at(step)) {
          refusal = fmt::format(
              "resume auto: {} has no meta.json (not a complete checkpoint: damaged, or not "
              "saved by berth), and this run would save there at step {}: move it out of {} "
              "and launch again with --resume auto ({})",
              dir, step, checkpoint_dir_, older);
          break;
        }
        passed.push_back(dir);
      }
      for (const std::string& dir : passed) {
        if (!refusal.empty()) break;
        log_warn(
            "resume auto: {} has no meta.json (not a complete checkpoint: damaged, or not "
            "saved by berth) and is passed by; {}",
            dir, latest.empty() ? older : "resuming from the newest complete one, " + latest);
      }
    }
    refusal = world_.broadcast_text(refusal);
    BERTH_CHECK(refusal.empty(), "{}", refusal);
    path = world_.broadcast_text(latest);
    if (path.empty()) {
      log_info("resume auto: no complete checkpoint in {}; starting at step 0", checkpoint_dir_);
      return;
    }
  }
  std::error_code ec;
  const int64_t unseen = world_.all_reduce_value<int64_t>(
      std::filesystem::exists(std::filesystem::path(path) / "meta.json", ec) ? 0 : 1,
      ReduceOp::SUM);
  BERTH_CHECK(unseen == 0 || unseen == world_.size(),
              "{} of the {} ranks cannot see checkpoint '{}' that rank 0 resumes from: every rank "
              "reads it, so checkpoint.dir must be on a filesystem all hosts share",
              unseen, world_.size(), path);
  const auto t0 = std::chrono::steady_clock::now();
  const CheckpointData ck = [&] {
    try {
      return load_checkpoint(path, true);
    } catch (const DamagedCheckpoint& e) {
      // A damaged checkpoint of this run's own checkpoint.dir: an older one (--resume PATH)
      // is refused while this later one is there, and --resume auto takes it again.
      const std::filesystem::path in = std::filesystem::path(without_trailing_slashes(path));
      if (!same_file_path(in.parent_path().string(), checkpoint_dir_)) throw;
      BERTH_FAIL_AS(DamagedCheckpoint,
                    "{}. It is in this run's checkpoint.dir: move {} out of {}, then launch again "
                    "with --resume auto, which resumes from the newest complete checkpoint left "
                    "there",
                    e.what(), in.string(), checkpoint_dir_);
    }
  }();
  // The same name on every rank, but the same checkpoint? (a stale copy on one host)
  // (one all-reduce by MAX: the minimum of x is -max(-x))
  int64_t span[4] = {-ck.meta.step, ck.meta.step, -ck.meta.rows_consumed, ck.meta.rows_consumed};
  world_.all_reduce(span, 4, ReduceOp::MAX);
  BERTH_CHECK(-span[0] == span[1] && -span[2] == span[3],
              "the ranks read different checkpoints at '{}' (steps {}..{}, data positions {}..{}): "
              "checkpoint.dir must be one directory that all hosts share",
              path, -span[0], span[1], -span[2], span[3]);
  const std::string diff = describe_shape_mismatch(ck.model, gcfg_);
  BERTH_CHECK(diff.empty(), "cannot resume from '{}': its model differs from the config: {}", path,
              diff);
  BERTH_CHECK(ck.has_optimizer(),
              "cannot resume from '{}': it holds weights only (an import?); start a new run from "
              "it with model.init_from instead",
              path);
  // --resume auto of a finished run (a requeued or resubmitted batch job whose run completed,
  // a signal during its last save included) has nothing left to do: run() says so and returns,
  // exit 0. A checkpoint named by path is a request to train on from it.
  BERTH_CHECK(
      ck.meta.step < cfg_.train.steps || (spec == "auto" && ck.meta.step == cfg_.train.steps),
      "checkpoint '{}' is at step {}, which already reaches train.steps = {}; raise "
      "train.steps to train further",
      path, ck.meta.step, cfg_.train.steps);
  model_->set_params(local_from_full(ck.params, ck.model));
  const ShardRange r = opt_->range();
  const std::vector<float> m = local_from_full(ck.adam_m, ck.model);
  const std::vector<float> v = local_from_full(ck.adam_v, ck.model);
  opt_->set_moments(m.data() + r.begin, v.data() + r.begin);
  opt_->set_steps_taken(ck.adam_step);
  skipped_steps_ = ck.meta.skipped_steps;
  loader_->set_rows_consumed(ck.meta.rows_consumed);
  start_step_ = ck.meta.step;
  resumed_from_ = path;
  if (world_.rank() == 0 && !ck.meta.config_toml.empty()) warn_resume_changes(path, ck.meta);
  log_info("resumed from {} at step {} (saved by layout {}) in {:.2f} s", path, start_step_,
           ck.meta.layout.empty() ? "?" : ck.meta.layout,
           seconds_since(t0));
}

void Trainer::require_same_config_on_every_rank() {
  // Ranks that read different configs (another file per host, --set on one side of an MPMD
  // launch) would run mismatched collectives until comm_timeout_s, or train with different
  // schedules. Compared before anything that one rank alone could refuse.
  const TextMismatch m = compare_with_rank0(world_, config_to_toml(cfg_));
  if (m.ranks == 0) return;
  // Name what differs: rank 0's config and that rank's.
  std::string keys;
  try {
    const std::vector<std::string> d = config_differences(
        parse_config(m.first, "rank 0's config"), parse_config(m.other, "the other config"));
    for (size_t i = 0; i < d.size() && i < 3; ++i) keys += (i ? "; " : "") + d[i];
    if (d.size() > 3) keys += fmt::format("; and {} more", d.size() - 3);
  } catch (const Error&) {
    keys = "see each rank's command line";  // the texts round-trip; kept from failing here
  }
  BERTH_FAIL(
      "{} of the {} ranks got another config than rank 0 (rank {} among them; rank 0 vs rank {}: "
      "{}): every rank must read the same config file with the same --set options",
      m.ranks, world_.size(), m.last, m.last, keys);
}

void Trainer::warn_resume_changes(const std::string& path, const CheckpointMeta& meta) const {
  RunConfig saved;
  try {
    saved = parse_config(meta.config_toml, path + "/meta.json");
  } catch (const Error& e) {
    log_warn("cannot compare this run's settings with the checkpoint's ({}); resuming anyway",
             e.what());
    return;
  }
  const int64_t rows_per_step =
      int64_t(grid_->shape().dp) * cfg_.parallel.microbatches * cfg_.train.micro_batch_size;
  int64_t saved_rows = meta.rows_per_step;
  if (saved_rows == 0 && saved.parallel.dp > 0)  // written before meta.json recorded it
    saved_rows = saved.parallel.dp * saved.parallel.microbatches * saved.train.micro_batch_size;
  const std::string changes =
      describe_resume_changes(saved, saved_rows, cfg_, rows_per_step, meta.step, meta.rows_consumed,
                              meta.data_fingerprint, data_fingerprint_);
  if (!changes.empty()) {
    log_warn("resuming from {} with other settings than the run that saved it: {}", path, changes);
  }
}

std::vector<float> Trainer::local_from_full(const std::vector<float>& full,
                                            const GPTConfig& from) const {
  const std::vector<float> f = repad_vocab(full, from, gcfg_);
  const ParamLayout whole = gpt_param_layout(gcfg_);
  const ParamLayout& mine = model_->layout();
  std::vector<float> out(size_t(mine.total));
  for (const ParamSpec& s : mine.specs) {
    slice_from_full(s, shard_.tp_rank, f.data() + whole.find(s.name).offset,
                    out.data() + s.offset);
  }
  return out;
}

std::vector<float> Trainer::gather_full(const std::vector<float>& local) {
  const GridShape& shape = grid_->shape();
  // Each tensor comes from the one rank that holds it uniquely among the replicas of dp = cp = 0.
  auto holder = [](const GridCoord& c) { return c.dp == 0 && c.cp == 0; };
  auto unique_elems = [](const ParamLayout& l) {
    int64_t n = 0;
    for (const ParamSpec& s : l.specs) n += s.unique ? s.numel : 0;
    return n;
  };
  const ParamLayout& mine = model_->layout();
  if (world_.rank() != 0) {
    if (holder(grid_->coord())) {
      std::vector<float> packed;
      packed.reserve(size_t(unique_elems(mine)));
      for (const ParamSpec& s : mine.specs) {
        if (s.unique) packed.insert(packed.end(), local.begin() + s.offset,
                                    local.begin() + s.offset + s.numel);
      }
      world_.group_begin();
      world_.send(packed.data(), packed.size(), DType::F32, 0);
      world_.group_end();
    }
    return {};
  }
  const ParamLayout whole = gpt_param_layout(gcfg_);
  std::vector<float> full(size_t(whole.total), 0.f);
  std::vector<float> packed;
  for (int r = 0; r < shape.world(); ++r) {
    const GridCoord c = grid_coord(shape, r);
    if (!holder(c)) continue;
    const ParamLayout theirs = gpt_param_layout(gcfg_, ModelShard{shape.tp, c.tp, shape.pp, c.pp});
    const float* src = local.data();
    if (r != 0) {
      packed.resize(size_t(unique_elems(theirs)));
      world_.group_begin();
      world_.recv(packed.data(), packed.size(), DType::F32, r);
      world_.group_end();
    }
    int64_t pos = 0;
    for (const ParamSpec& s : theirs.specs) {
      if (!s.unique) continue;
      const float* from = r == 0 ? src + s.offset : packed.data() + pos;
      place_into_full(s, c.tp, from, full.data() + whole.find(s.name).offset);
      pos += s.numel;
    }
  }
  return repad_vocab(full, gcfg_, canonical_);
}

std::vector<float> Trainer::full_params() { return gather_full(model_->params_host()); }

void Trainer::gather_moment_shards(std::vector<float>* m, std::vector<float>* v) {
  const GridShape& shape = grid_->shape();
  const GridCoord& me = grid_->coord();
  const int group = shape.dp * shape.cp;
  if (group == 1) return;  // the shard is the whole layout
  // dp_cp's rank k is (dp, cp) = (k / cp, k % cp) and holds shard k (shard_counts_).
  auto world_rank_of = [&](int k) {
    return grid_rank(shape, GridCoord{me.tp, k % shape.cp, me.pp, k / shape.cp});
  };
  if (me.dp != 0 || me.cp != 0) {
    world_.group_begin();
    world_.send(m->data(), m->size(), DType::F32, world_rank_of(0));
    world_.send(v->data(), v->size(), DType::F32, world_rank_of(0));
    world_.group_end();
    return;
  }
  std::vector<float> whole_m(size_t(model_->layout().total)), whole_v(whole_m.size());
  std::copy(m->begin(), m->end(), whole_m.begin());
  std::copy(v->begin(), v->end(), whole_v.begin());
  world_.group_begin();
  size_t offset = shard_counts_[0];
  for (int k = 1; k < group; ++k) {
    world_.recv(whole_m.data() + offset, shard_counts_[size_t(k)], DType::F32, world_rank_of(k));
    world_.recv(whole_v.data() + offset, shard_counts_[size_t(k)], DType::F32, world_rank_of(k));
    offset += shard_counts_[size_t(k)];
  }
  world_.group_end();
  m->swap(whole_m), v->swap(whole_v);
}

double Trainer::save(int64_t steps_done) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointData ck;
  ck.model = canonical_;
  ck.adam_step = opt_->steps_taken();
  // This rank's moments, whole over its layout. With ZeRO-1 the shards meet only on the rank
  // gather_full reads (dp = cp = 0 of this tp and pp coordinate): an all-gather gave every rank
  // of the group 8 bytes a parameter of its layout in host memory during the save, for nothing.
  // By the world's p2p, which carries host buffers on either backend (collective).
  std::vector<float> m = opt_->m_host(), v = opt_->v_host();
  if (cfg_.parallel.zero == 1) gather_moment_shards(&m, &v);
  // Whole tensors, assembled on rank 0 from every tp slice and pipeline stage (collective).
  ck.params = gather_full(model_->params_host());
  ck.adam_m = gather_full(m);
  ck.adam_v = gather_full(v);
  if (world_.rank() == 0) {
    ck.meta.step = steps_done;
    ck.meta.skipped_steps = skipped_steps_;
    ck.meta.data_fingerprint = data_fingerprint_;
    ck.meta.rows_consumed = loader_->rows_consumed();
    ck.meta.seed = cfg_.run.seed;
    ck.meta.rows_per_step =
        int64_t(grid_->shape().dp) * cfg_.parallel.microbatches * cfg_.train.micro_batch_size;
    ck.meta.config_toml = config_to_toml(cfg_);
    ck.meta.layout = describe_grid(grid_->shape());
    ck.meta.source = "berth train";
    ck.meta.fencing_token = fencing_token_;
    relock_checkpoint_dir_if_gone(steps_done);
    const std::string dir = checkpoint_dir_ + "/" + checkpoint_dir_name(steps_done);
    save_checkpoint(dir, ck, cfg_.debug.checkpoint_pause_s);
    const int pruned = prune_checkpoints(checkpoint_dir_, cfg_.checkpoint.keep_last);
    log_info("checkpoint: saved {} in {:.2f} s{}", dir,
             seconds_since(t0),
             pruned > 0 ? fmt::format(" (removed {} older)", pruned) : std::string());
  }
  world_.barrier();  // no rank runs ahead of a save that may still fail on rank 0
  return seconds_since(t0);
}

PackedBatch& Trainer::model_batch(PackedBatch& full, PackedBatch& local) {
  if (grid_->shape().cp == 1) return full;
  cp_local_batch(full, grid_->shape().cp, grid_->coord().cp, &local);
  return local;
}

void Trainer::sync_and_update(double lr, StepStats* st) {
  Communicator& g = grid_->dp_cp();
  DeviceBuffer<float>& params = model_->params();
  DeviceBuffer<float>& grads = model_->grads();
  Backend& be = model_->backend();
  const int64_t n = int64_t(grads.size());
  const ParamLayout& layout = model_->layout();
  if (grid_->shape().pp > 1 && (shard_.first() || shard_.last())) {
    // Tied embeddings: the first stage's wte and the last stage's LM head are one parameter.
    const ParamSpec& wte = layout.find("wte");
    grid_->embed().all_reduce(grads.data() + wte.offset, grads.data() + wte.offset,
                              size_t(wte.numel), DType::F32, ReduceOp::SUM);
  }
  // The global norm counts every unique tensor once: summed over this rank's unique elements,
  // then over the tensor- and pipeline-parallel groups.
  auto global_norm = [&](double sq) {
    if (grid_->shape().tp > 1) sq = grid_->tp().all_reduce_value(sq, ReduceOp::SUM);
    if (grid_->shape().pp > 1) sq = grid_->pp().all_reduce_value(sq, ReduceOp::SUM);
    return std::sqrt(sq);
  };
  if (cfg_.parallel.zero == 1) {
    // ZeRO-1: each rank receives the reduced gradients of its shard, updates its shard of the
    // parameters with its shard of the moments, and the shards are gathered back.
    g.reduce_scatter(grads.data(), shard_grads_.data(), shard_counts_, DType::F32, ReduceOp::SUM);
    const ShardRange r = opt_->range();
    st->grad_norm = global_norm(g.all_reduce_value(
        unique_sum_squares(be, layout, shard_grads_.data(), r.begin, r.end), ReduceOp::SUM));
    opt_->step(params.data(), shard_grads_.data(), lr, st->grad_norm);
    g.all_gather(params.data() + opt_->range().begin, params.data(), shard_counts_, DType::F32);
  } else {
    all_reduce_gradients(g, grads.data(), n, kGradBucketElems);
    st->grad_norm = global_norm(unique_sum_squares(be, layout, grads.data(), 0, n));
    opt_->step(params.data(), grads.data(), lr, st->grad_norm);
  }
  if (grid_->shape().pp > 1 && (shard_.first() || shard_.last())) {
    // The two copies of the tied wte had the same summed gradient, but reduced over dp×cp at
    // different places of their buffers (different summation order with 3+ ranks): the first
    // stage's weights are the ones both keep.
    const ParamSpec& wte = layout.find("wte");
    grid_->embed().broadcast(params.data() + wte.offset, size_t(wte.numel), DType::F32, 0);
  }
}

StepStats Trainer::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  if (world_.rank() == cfg_.debug.fail_rank && step == cfg_.debug.fail_step) {
    BERTH_FAIL("failure injected by debug.fail_rank = {} at step {} (debug.fail_step)",
               cfg_.debug.fail_rank, step);
  }
  Communicator& g = grid_->dp_cp();
  StepStats st;
  st.step = step;
  st.lr = lr_at(step, cfg_.train.steps, cfg_.train.lr, cfg_.train.min_lr, cfg_.train.warmup_steps,
                schedule_);
  // Load every micro-batch first: the global target count normalizes each backward.
  int64_t local_targets = 0, replica_tokens = 0;
  const auto t_data = std::chrono::steady_clock::now();
  for (size_t i = 0; i < batches_.size(); ++i) {
    PackedBatch& b = batches_[i];
    if (cfg_.debug.data_delay_s > 0) sleep_seconds(cfg_.debug.data_delay_s);
    loader_->next(&b);
#ifndef NDEBUG
    check_invariants(b, gcfg_.V, gcfg_.maxT);  // debug builds check every batch
#endif
    const PackedBatch& mine = model_batch(b, cp_batches_[i]);
    local_targets += mine.n_targets();
    replica_tokens += b.N() - b.n_padding;  // the whole rows: every cp rank of a replica has them
  }
  st.data_wait_s = seconds_since(t_data);
  // The global target count, and the tokens of documents the global batch holds (padding is
  // computed on, not trained on: counted, padded rows read as fast as packed ones), each dp
  // replica's counted once.
  int64_t counts[2] = {local_targets, grid_->coord().cp == 0 ? replica_tokens : 0};
  g.all_reduce(counts, 2, ReduceOp::SUM);
  const int64_t n_targets = counts[0];
  st.tokens = counts[1];
  const double tokens = double(st.tokens);
  if (n_targets == 0) {
    // A loss_mask can mask every token of a global batch (documents that are all prompt): a mean
    // over no tokens is no loss, and an update from zero gradients would still move the weights
    // (AdamW's momentum, weight decay). Every rank knows it from the same sum, so all skip alike;
    // the schedule goes on. It stopped the run, hundreds of steps in.
    if (world_.rank() == 0) {
      log_warn(
          "step {}: the global batch has no target tokens (data.train's loss_mask masks all "
          "of them): no update at this step; larger batches (train.micro_batch_size, "
          "parallel.microbatches) make it rarer",
          step + 1);
    }
    st.no_targets = true;
    ++skipped_steps_;
    st.loss = std::numeric_limits<double>::quiet_NaN();
    st.seconds = seconds_since(t0);
    // Nothing was computed: no tokens trained, no rate (it read 7.9 M tok/s, the batch's tokens
    // over the time to load it), and the progress predictor leaves the step out of its rate.
    st.tokens = 0;
    return st;
  }
  model_->zero_grad();
  // Forward and backward of every micro-batch in the order of this stage's schedule (with one
  // stage: F0 B0 F1 B1 ...), activations and gradients passed between stages by the executor.
  std::vector<const PackedBatch*> mine;
  for (size_t i = 0; i < batches_.size(); ++i) {
    mine.push_back(grid_->shape().cp > 1 ? &cp_batches_[i] : &batches_[i]);
  }
  StageRunner runner(*model_, std::move(mine), float(1.0 / double(n_targets)), true);
  st.bubble_s = run_schedule(grid_->pp(), train_actions_, runner).transfer_s;
  double loss_sum = runner.loss_sum();  // the last stage's
  if (grid_->shape().pp > 1) loss_sum = grid_->pp().all_reduce_value(loss_sum, ReduceOp::SUM);
  if (world_.rank() == cfg_.debug.slow_rank) sleep_seconds(cfg_.debug.slow_rank_s);
  st.loss = g.all_reduce_value(loss_sum, ReduceOp::SUM) / double(n_targets);
  BERTH_CHECK(
      std::isfinite(st.loss), "loss is {} at step {} (of {}): training diverged; {}", st.loss,
      step + 1, cfg_.train.steps,
      cfg_.train.grad_clip > 0
          ? fmt::format("lower train.lr ({}; train.grad_clip = {} already clips)", cfg_.train.lr,
                        cfg_.train.grad_clip)
          : fmt::format("lower train.lr ({}) or set train.grad_clip (e.g. 1.0)", cfg_.train.lr));
  sync_and_update(st.lr, &st);
  st.seconds = seconds_since(t0);
  // A step allocates nothing once the first ones have run, so the held heap is sampled (mallinfo2
  // walks the allocator's bins: tens of µs) after the first two and every progress interval.
  if (++steps_run_ <= 2 || step % cfg_.progress.interval == 0) {
    heap_peak_ = std::max(heap_peak_, heap_in_use_bytes());
  }
  if (cfg_.debug.leak_mib_per_step > 0) {  // a deliberate leak, touched so it is resident
    leaked_.emplace_back(size_t(cfg_.debug.leak_mib_per_step * 1024 * 1024), char(1));
  }
  st.tokens_per_s = tokens / st.seconds;
  st.model_flops_per_s = flops_per_token_ * tokens / st.seconds;
  return st;
}

void Trainer::load_eval_batches() {
  val_loader_->set_rows_consumed(0);
  const size_t n = size_t(cfg_.eval.batches);
  val_batches_.resize(n);
  cp_val_batches_.resize(n);
  eval_batches_.clear();
  int64_t count = 0;
  for (size_t i = 0; i < n; i++) {
    val_loader_->next(&val_batches_[i]);
    const PackedBatch& b = model_batch(val_batches_[i], cp_val_batches_[i]);
    eval_batches_.push_back(&b);
    count += b.n_targets();
  }
  eval_targets_ = grid_->dp_cp().all_reduce_value(count, ReduceOp::SUM);
}

double Trainer::evaluate() {
  BERTH_CHECK(val_loader_ != nullptr, "evaluation needs data.val");
  StageRunner runner(*model_, eval_batches_, 0.f, false);
  const GridShape& shape = grid_->shape();
  run_schedule(grid_->pp(),
               schedule_forward_only(shape.pp, shard_.stage, int(eval_batches_.size())), runner);
  double sum = runner.loss_sum();
  if (shape.pp > 1) sum = grid_->pp().all_reduce_value(sum, ReduceOp::SUM);
  return grid_->dp_cp().all_reduce_value(sum, ReduceOp::SUM) / double(eval_targets_);
}

void Trainer::lock_run_dir() {
  run_lock_ = std::make_unique<RunDirLock>(run_dir_, "run directory", run_dir_, leased(),
                                           cfg_.reservation.id);
}

void Trainer::lock_checkpoint_dir() {
  // Another run saving into this run's checkpoint.dir (its own, or this run's checkpoints/ that
  // another run.name was pointed at) failed a save on the other's step directory, or mixed the two
  // runs' checkpoints for --resume auto. A checkpoint.dir that is the run directory is locked as
  // that.
  if (ckpt_lock_ || same_file_path(checkpoint_dir_, run_dir_)) return;
  ckpt_lock_ = std::make_unique<RunDirLock>(checkpoint_dir_, "checkpoint directory", run_dir_,
                                            leased(), cfg_.reservation.id);
}

void Trainer::rescue_metrics(const std::string& metrics, const std::string& why) const {
  // The run directory's disk full (or read-only) to the end: the step records since its .partial
  // stopped were only in memory, and the failed commit lost them. They go beside the checkpoints
  // (often another disk), else into the temporary directory, and the error says where.
  const int64_t records = std::count(metrics.begin(), metrics.end(), '\n');
  std::error_code ec;
  const std::string tmp = std::filesystem::temp_directory_path(ec).string();
  std::string tried;
  for (const std::string& dir : {checkpoint_dir_, tmp}) {
    if (dir.empty()) continue;
    // (the time too: a container's next session often has the same pid)
    const std::string path =
        fmt::format("{}/metrics.rescued-{}-{}.jsonl", dir, int64_t(unix_now()), ::getpid());
    try {
      write_file_atomic(path, metrics);
    } catch (const Error& e) {
      tried += fmt::format("; {}: {}", path, e.what());
      continue;
    }
    BERTH_FAIL(
        "{}. This run's {} step records are in {} instead: move it to {}/metrics.jsonl when "
        "that disk has room",
        why, records, path, run_dir_);
  }
  BERTH_FAIL(
      "{}. This run's {} step records could not be written elsewhere either{}: they are lost", why,
      records, tried);
}

namespace {
// The first entry of `dir` (a directory moved into a path this run writes), "" when it is empty
// or absent.
std::string first_entry(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    return e.path().filename().string();
  }
  return "";
}
}  // namespace

bool Trainer::relock_run_dir_if_gone(const std::string& before) {
  // A run directory removed (rm -rf) during the run took its lock, config.toml and the session's
  // trace with it, and the run failed at the end on the trace, losing every metric. It is said
  // and made again; one replaced by a directory holding anything (another run's) is refused
  // before anything is written there.
  if (!run_lock_ || run_lock_->in_place()) return false;
  if (!run_lock_->same_directory()) {
    if (const std::string entry = first_entry(run_dir_); !entry.empty()) {
      BERTH_FAIL(
          "the run directory {} was replaced during the run by a directory holding files ({}): "
          "not this run's; refusing to write there. Move it away, then continue with --resume",
          run_dir_, entry);
    }
  }
  log_warn(
      "the run directory {} was removed or replaced during the run (its lock file is gone), and "
      "this session's trace.csv with it. Taking it again {}: config.toml is written again now "
      "and metrics.jsonl from memory at the end",
      run_dir_, before);
  run_lock_.reset();
  ensure_writable_dir(run_dir_, "run directory (run.out_dir/run.name)");
  lock_run_dir();
  write_file_atomic(run_dir_ + "/config.toml", config_to_toml(cfg_));
  return true;
}

void Trainer::relock_checkpoint_dir_if_gone(int64_t step) {
  // A checkpoint.dir removed (rm -rf) or replaced (mv) during the run was made again by the next
  // save without a word: the checkpoints saved there were gone and its lock with them, so a run
  // of another name could then save into it, and one did, mixing the two runs' checkpoints. It is
  // said, and the directory taken again (refused, failing this save, if another run holds it
  // now). One replaced by a directory holding anything (another run's checkpoints: keep_last
  // would prune them, --resume auto take the newest) is refused before anything is written.
  bool taken_again = relock_run_dir_if_gone(fmt::format("before step {}'s checkpoint", step));
  if (ckpt_lock_ && !ckpt_lock_->in_place()) {
    taken_again = true;
    if (ckpt_lock_->same_directory()) {
      log_warn("checkpoint.dir {}: its lock file was removed during the run; taking it again",
               checkpoint_dir_);
    } else {
      if (const std::string entry = first_entry(checkpoint_dir_); !entry.empty()) {
        BERTH_FAIL(
            "checkpoint.dir {} was replaced during the run by a directory holding files ({}): "
            "not this run's; refusing to save (and prune) there. Move it away, or give "
            "checkpoint.dir another path, then continue with --resume",
            checkpoint_dir_, entry);
      }
      log_warn(
          "checkpoint.dir {} was removed or replaced during the run (its lock file is gone): "
          "the checkpoints this run saved there are not in it any more (moved or deleted). "
          "Taking it again to save step {} there",
          checkpoint_dir_, step);
    }
    ckpt_lock_.reset();
    ensure_writable_dir(checkpoint_dir_, "checkpoint directory (checkpoint.dir)");
    lock_checkpoint_dir();
  }
  // checkpoint.dir's FENCE may have gone too: this lease's token goes in again before the save
  if (taken_again && fencing_token_) claim_checkpoint_fence(checkpoint_dir_, *fencing_token_);
}

bool Trainer::saves_at(int64_t step) const {
  const int64_t interval = cfg_.checkpoint.interval;
  return (interval > 0 && step % interval == 0) ||
         (cfg_.checkpoint.final && step == cfg_.train.steps);
}

void Trainer::warn_uncommitted_metrics() const {
  // The run was killed after its last save and before it committed metrics.jsonl: what is there
  // (nothing, or an earlier session's) stops short of the run's last step, and the records are
  // in the file that session streamed (metrics.jsonl.partial; .partial.resume when a resume's
  // copy was left, the one a .partial beside it is a cut copy of). Said, not fixed: this launch
  // holds no lease yet, and the killed session's files are not its to commit.
  const std::string metrics = run_dir_ + "/metrics.jsonl";
  const std::optional<int64_t> committed = last_recorded_step(metrics);
  if (committed && *committed >= start_step_) return;
  std::error_code ec;
  std::string source = metrics + ".partial.resume";
  if (!std::filesystem::exists(source, ec)) source = metrics + ".partial";
  const std::string what = committed ? fmt::format("{} ends at step {}", metrics, *committed)
                                     : fmt::format("{} was never committed", metrics);
  if (!std::filesystem::exists(source, ec)) {
    log_warn(
        "{} (the run was killed after its last save, step {}, and before it committed its "
        "metrics), and no metrics.jsonl.partial holds the rest",
        what, start_step_);
    return;
  }
  std::istringstream in(read_text_file(source));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);)
    if (const std::optional<int64_t> step = record_step(line); step && *step <= start_step_)
      steps.push_back(*step);
  const std::string lost = missing_steps(steps, start_step_);
  log_warn(
      "{} (the run was killed after its last save, step {}, and before it committed its "
      "metrics): {} holds the records{}; copy its lines up to step {} to metrics.jsonl to keep "
      "them",
      what, start_step_, source,
      steps.empty()
          ? std::string(" of no step")
          : fmt::format(" up to step {}{}", *std::max_element(steps.begin(), steps.end()),
                        lost.empty() ? std::string() : fmt::format(" (steps {} are lost)", lost)),
      start_step_);
}

std::vector<StepStats> Trainer::run() {
  if (start_step_ == cfg_.train.steps) {  // resumed (auto) from the run's last step
    log_info(
        "nothing to train: the run is complete ({} is at step {} = train.steps); raise "
        "train.steps to train further",
        resumed_from_, start_step_);
    if (world_.rank() == 0) {
      try {  // a warning: the run is complete whatever these files hold
        warn_uncommitted_metrics();
      } catch (const std::exception& e) {
        log_warn("cannot read {}/metrics.jsonl or its .partial: {}", run_dir_, e.what());
      }
    }
    return {};
  }
  // A new run must not collide with an earlier run's checkpoints: its first save would fail after
  // hours of training. Checked before anything is taken or written.
  if (const std::optional<std::string> newest = latest_checkpoint(checkpoint_dir_)) {
    const std::string name = std::filesystem::path(*newest).filename().string();
    const int64_t step = checkpoint_step(*newest);
    // A resume from an earlier checkpoint than the newest (going back past a loss spike) would
    // save over the later ones, and a relaunch's --resume auto would take those.
    BERTH_CHECK(step <= start_step_ || !resumed_from_.empty(),
                "checkpoint.dir {} already holds checkpoints of an earlier run (the newest, {}, "
                "is at step {}) and this run starts at step {}: continue that run with --resume "
                "auto, or give this one another run.name or checkpoint.dir",
                checkpoint_dir_, name, step, start_step_);
    BERTH_CHECK(step <= start_step_,
                "this run resumes from {} at step {}, but checkpoint.dir {} holds later "
                "checkpoints (the newest, {}, is at step {}): its saves would collide with them, "
                "and a relaunch with --resume auto would continue from them. To go back to step "
                "{}, move the step directories after it out of {}, or give this run another "
                "run.name (or checkpoint.dir) and keep --resume {}",
                resumed_from_, start_step_, checkpoint_dir_, name, step, start_step_,
                checkpoint_dir_, resumed_from_);
  }
  // Nor with an earlier run's committed results when there is no checkpoint to continue it from
  // (checkpoint.interval = 0, checkpoint.final = false): a new run of the same name replaced its
  // metrics.jsonl, config.toml and trace.csv without a word, also under --resume auto finding no
  // checkpoint (a batch script that always passes it). Only a run that ended normally commits
  // metrics.jsonl, and one stopped early (window, signal) saves a checkpoint; a killed, failed or
  // fenced-out run leaves metrics.jsonl.partial, which does not count: its relaunch, or a launch
  // taking its lease over, continues that run.
  if (world_.rank() == 0 && start_step_ == 0) {
    const std::optional<int64_t> last = last_recorded_step(run_dir_ + "/metrics.jsonl");
    BERTH_CHECK(!last,
                "the run directory {} holds an earlier run of this name (its metrics.jsonl "
                "records steps up to {}) and checkpoint.dir {} holds no checkpoint to continue "
                "it from: give this run another run.name (or run.out_dir), or move that "
                "directory away to run it again (or point checkpoint.dir at that run's "
                "checkpoints and pass --resume auto)",
                run_dir_, last.value_or(0), checkpoint_dir_);
  }
  // A step directory without meta.json (not a checkpoint berth saved) where this run's config
  // saves would fail that save, after the steps before it.
  for (const auto& [step, dir] : incomplete_checkpoints(checkpoint_dir_)) {
    const bool saves_there = step > start_step_ && step <= cfg_.train.steps && saves_at(step);
    BERTH_CHECK(!saves_there,
                "checkpoint.dir holds {} without meta.json (not a checkpoint berth saved), where "
                "this run saves at step {}: remove it, or give this run another checkpoint.dir",
                dir, step);
  }
  // From here a stop signal (SIGTERM, SIGINT, SIGUSR1) ends the run at the next step, with a
  // checkpoint and the lease given back, instead of killing it.
  const StopSignals stop_signals;
  // The lease comes first: a refused one leaves nothing behind (collective; LeaseRefused).
  LeaseKeeper lease(cfg_, world_);
  set_fencing_token(lease.token());
  // Rank 0 owns the run directory; a failure there aborts every rank (main → MPI_Abort).
  const bool writer = world_.rank() == 0;
  const std::string resolved = config_to_toml(cfg_);
  if (writer) {
    std::error_code ec;
    // Before anything is made: the longest paths a run writes, a save's temporary meta.json
    // (write_file_atomic: .tmp.<pid>.<counter>) in its temporary directory, and the run
    // directory's metrics set aside at a resume, as a temporary.
    constexpr int64_t kMaxPid = 4194304;  // Linux's pid_max at most
    require_paths_fit(checkpoint_dir_,
                      fmt::format("{}.tmp-{}/meta.json.tmp.{}.{}",
                                  checkpoint_dir_name(cfg_.train.steps), kMaxPid, kMaxPid, INT_MAX),
                      "checkpoint.dir");
    require_paths_fit(run_dir_,
                      fmt::format("metrics.jsonl.partial.resume.tmp.{}.{}", kMaxPid, INT_MAX),
                      "the run directory (run.out_dir/run.name)");
    const bool run_dir_existed = std::filesystem::exists(run_dir_, ec);
    ensure_writable_dir(run_dir_, "run directory (run.out_dir/run.name)");
    // The checkpoint directory is checked now, not at the first save: an unusable checkpoint.dir
    // would otherwise fail only after the steps before it had run (all of them with
    // checkpoint.interval = 0). A refusal takes back the run directory it made (it was left
    // empty).
    const bool ckpt_dir_existed = std::filesystem::exists(checkpoint_dir_, ec);
    try {
      ensure_writable_dir(checkpoint_dir_, "checkpoint directory (checkpoint.dir)");
      // Before anything in the run directory is written or cleaned (a live run's checkpoint
      // temporaries, its FENCE); taken in the constructor already where the directories existed.
      if (!run_lock_) lock_run_dir();
      lock_checkpoint_dir();
    } catch (const Error&) {
      // What this launch made, and only that, is taken back (left empty but for its own lock).
      if (!ckpt_dir_existed) std::filesystem::remove(checkpoint_dir_, ec);
      if (!run_dir_existed) {
        run_lock_.reset();
        std::filesystem::remove(run_dir_ + "/.berth.lock", ec);
        std::filesystem::remove(run_dir_, ec);
      }
      throw;
    }
    // The lease's token goes into checkpoint.dir's FENCE now, not at the first save: a holder
    // this run took the lease from must not commit in between.
    if (fencing_token_) claim_checkpoint_fence(checkpoint_dir_, *fencing_token_);
    write_file_atomic(run_dir_ + "/config.toml", resolved);
    const int cleaned = clean_partial_checkpoints(checkpoint_dir_);
    if (cleaned > 0) {
      log_info("checkpoint: removed {} incomplete checkpoint(s) left in {} by an interrupted save",
               cleaned, checkpoint_dir_);
    }
  }
  log_info("berth {} | resolved config ({} → {}/config.toml):\n{}", BERTH_VERSION,
           cfg_.source.empty() ? "built-in" : cfg_.source, run_dir_, resolved);
  const int64_t n_params = gpt_param_layout(canonical_).total;
  log_info(
      "model: {} parameters ({:.2f} M; {} on this rank), L={} C={} NH={} V={} (padded {}) | "
      "batch {}x{} | {:.1f} MFLOP/token | {} OpenMP threads | activations {:.1f} MiB in {} "
      "slot(s) | device {}, {} GEMMs, {}",
      n_params, double(n_params) / 1e6, model_->layout().total, gcfg_.L, gcfg_.C, gcfg_.NH, gcfg_.V,
      gcfg_.Vp, cfg_.train.micro_batch_size, cfg_.data.seq_len, flops_per_token_ / 1e6,
      omp_get_max_threads(), double(model_->activation_bytes()) / (1024.0 * 1024.0),
      model_->slots(), backend_->name(), matmul_precision_name(backend_->matmul_precision()),
      attention_path(*backend_, gcfg_.C / gcfg_.NH));
  if (backend_->kind() == DeviceKind::kCuda &&
      backend_->matmul_precision() == MatmulPrecision::kBf16 &&
      !backend_->attention_on_tensor_cores(gcfg_.C / gcfg_.NH))
    log_info(
        "warning: attention at head size {} runs on the fp32 kernels, not on tensor cores "
        "(those take head sizes 32, 64, 80, 96 and 128 where the GPU's shared memory holds their "
        "blocks); the GEMMs stay bf16",
        gcfg_.C / gcfg_.NH);
  if (backend_->kind() == DeviceKind::kCuda &&
      backend_->matmul_precision() == MatmulPrecision::kFp32)
    log_info(
        "note: run.precision = \"fp32\" on a GPU runs the GEMMs and attention in fp32 without "
        "TF32 (the CPU reference's numbers, far below the tensor cores' speed); set "
        "run.precision = \"bf16\" to train at speed");
  log_info("data: {} tokens in {} documents | {}", train_ds_.n_tokens(), train_ds_.n_docs(),
           data_summary_);
  const GridShape& shape = grid_->shape();
  const LocalRank local = mpi_local_rank();
  if (backend_->kind() == DeviceKind::kCpu)
    warn_if_threads_oversubscribed(local, "fewer threads train faster here");
  log_info("layout: {} | {} rank(s) on this host | global batch {} rows = dp {} x microbatches "
           "{} x micro_batch_size {}{} | "
           "ZeRO-{}{}",
           describe_grid(shape), local.size, int64_t(shape.dp) * cfg_.parallel.microbatches *
                                     cfg_.train.micro_batch_size,
           shape.dp, cfg_.parallel.microbatches, cfg_.train.micro_batch_size,
           shape.pp > 1 ? fmt::format(" | pipeline {} (stage {}: layers {})",
                                      cfg_.parallel.schedule, shard_.stage,
                                      describe_layers(gcfg_.L, shape.pp, shard_.stage))
                        : std::string(),
           cfg_.parallel.zero,
           cfg_.parallel.zero == 1
               ? fmt::format(" (optimizer moments: {} of {} parameters on this rank)",
                             opt_->range().size(), model_->layout().total)
               : std::string());

  // The pre-flight plan of this config on this machine (berth plan), made and logged by rank 0
  // (it reads the datasets' headers), to set beside the measured figures at the end. A plan that
  // cannot be made is a notice only.
  const std::optional<Plan>& plan = preflight_;
  if (writer && plan) {
    log_info("plan ({}): {} per rank on stage 0, peak {} on stage {}, step {:.3f} s",
             plan->hw.source == "built-in" ? plan->hw.name : plan->hw.source,
             format_bytes(plan->stage_memory.front().total()), format_bytes(plan->peak.total()),
             plan->peak_stage, plan->step.total());
  } else if (writer) {
    log_warn("no pre-flight plan for this run: {}", preflight_error_);
  }

  // metrics.jsonl: one JSON object per step, rewritten whole at the end via temporary + rename;
  // lines are also appended to a .partial file as the run goes so a live run can be followed.
  const std::string metrics_path = run_dir_ + "/metrics.jsonl";
  const std::string partial_path = metrics_path + ".partial";
  std::ofstream partial;
  FileId partial_id;  // the file `partial` writes (a stop's amend cuts only that one)
  if (writer) {
    std::error_code ec;
    // A .resume already there is what a resume that could not copy it back kept (below): the
    // .partial beside it holds a cut copy of it at most. A run from step 0 has no earlier steps:
    // such a file is of an earlier run, and would be taken for this one's at its resume.
    if (start_step_ == 0) std::filesystem::remove(partial_path + ".resume", ec);
    if (start_step_ > 0 && std::filesystem::exists(partial_path, ec) &&
        !std::filesystem::exists(partial_path + ".resume", ec)) {
      std::filesystem::rename(partial_path, partial_path + ".resume", ec);
    }
    // (A .partial beside a .resume is a cut copy of it: the new one replaces it, below.)
  }
  std::string metrics;
  // A killed run left its lines in the .partial file (now .resume); a finished one in
  // metrics.jsonl.
  std::error_code resume_ec;
  const std::string previous = std::filesystem::exists(partial_path + ".resume", resume_ec)
                                   ? partial_path + ".resume"
                                   : metrics_path;
  if (writer && start_step_ > 0) {  // keep the metrics of the steps before the resumed one
    std::error_code ec;
    if (std::filesystem::exists(previous, ec)) {
      std::istringstream in(read_text_file(previous));
      int64_t unreadable = 0;
      std::vector<int64_t> kept;
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const std::optional<int64_t> step = record_step(line);
        if (!step) {
          ++unreadable;  // a run killed mid-write leaves its last line cut short
        } else if (*step <= start_step_) {
          metrics += line + "\n";
          kept.push_back(*step);
        }
      }
      if (unreadable > 0) {
        log_warn(
            "metrics: {} line(s) of {} are not step records and are left out of this run's "
            "metrics.jsonl (a run killed while writing cuts its last line short)",
            unreadable, previous);
      }
      // Steps missing between the first recorded one and the checkpoint's, or all of them (a
      // write that failed on a full disk, a file cut short): said, since metrics.jsonl will lack
      // them for good. (Steps before the first record are not: a run resumed from another run's
      // checkpoint records from there.)
      const std::string missing = missing_steps(kept, start_step_);
      if (!missing.empty()) {
        log_warn(
            "metrics: {} has no record of step(s) {} of this run (a write that failed, e.g. "
            "on a full disk); metrics.jsonl will lack them",
            previous, missing);
      } else if (kept.empty()) {
        log_warn(
            "metrics: {} has no record of the steps before {} (a write that failed, e.g. on "
            "a full disk, or a run resumed from another run's checkpoint that stopped "
            "before its first step); metrics.jsonl will have none of them",
            previous, start_step_ + 1);
      }
    }
  }
  if (writer) {
    // The new .partial holds the records before the resumed step (none from step 0), whole or not
    // at all: written beside, synced and renamed into place, and only then is `previous` (a
    // .resume) let go; a copy that fails leaves it for the next start, and no cut .partial that
    // the next start would take for the killed run's records. A new file, not the old one
    // truncated: a holder that lost the lease may still have that one open, and its writes must
    // not land in this run's metrics.
    try {
      write_file_atomic(partial_path, metrics);
      sync_to_disk(partial_path);
    } catch (const Error& e) {
      std::error_code ec;
      std::filesystem::remove(partial_path, ec);  // (a cut copy of a .resume)
      BERTH_FAIL(
          "{}: free space in {}; the metrics of the steps before {} are kept in {} for "
          "the next start",
          e.what(), run_dir_, start_step_ + 1, previous);
    }
    std::error_code ec;
    std::filesystem::remove(partial_path + ".resume", ec);
    partial.open(partial_path, std::ios::app);
    BERTH_CHECK(partial.good(), "cannot write {}: {}", partial_path, std::strerror(errno));
    partial_id = file_id(partial_path);
  }
  std::vector<StepStats> all;
  const int64_t steps = cfg_.train.steps;
  const int64_t tokens_per_step = int64_t(shape.dp) * cfg_.parallel.microbatches *
                                  cfg_.train.micro_batch_size * cfg_.data.seq_len;
  ProgressTracker progress(cfg_, *grid_, run_dir_, start_step_, tokens_per_step, flops_per_token_,
                           lease.window_end(), lease.reservation(), backend_);
  const auto t_session = std::chrono::steady_clock::now();
  int64_t saved_at = -1;  // step of the newest checkpoint this session
  nlohmann::json last_line;  // the newest step's metrics object (the last line of `metrics`)
  std::streamoff partial_line_at = -1;  // where the last line of metrics.jsonl.partial starts
  bool partial_failed = false;          // a write of metrics.jsonl.partial failed (said once)
  int64_t partial_failed_at = 0;        // at that step
  // A stop (signal, window's end) before step `done` + 1: after the session's first step, a
  // checkpoint of step `done` unless it saved already, booked into that step's record as a
  // periodic save is (collective: the save).
  auto stop_after = [&](int64_t done) {
    if (done <= start_step_) return;
    double save_s = 0;
    if (saved_at != done) lease.checkpoint_took(save_s = save(done));
    const size_t old_size = last_line.dump().size() + 1;
    progress.stopped_after(done, save_s, &last_line);
    const std::string line = last_line.dump() + "\n";
    metrics.resize(metrics.size() - std::min(metrics.size(), old_size));
    metrics += line;
    // The .partial file too (a run that ends fenced out or lease-lost commits only that one):
    // cut where the line began, the line written again.
    if (writer && !partial_failed &&
        !rewrite_from(partial, partial_path, partial_id, partial_line_at, line)) {
      if (file_id(partial_path) != partial_id) {
        log_warn(
            "metrics: {} is another launch's file now (it took the run directory over); "
            "left alone",
            partial_path);
      } else {
        log_warn("metrics: cannot rewrite the last line of {}; metrics.jsonl has it", partial_path);
      }
    }
  };
  // The newest step that trained: a skipped one (no targets) takes milliseconds, and a window's
  // end judged by it would let a real step start too late.
  double last_wall = 0, last_step_s = 0;
  for (int64_t step = start_step_; step < steps; step++) {
    if (step == cfg_.debug.stall_step && world_.rank() == 0) sleep_seconds(cfg_.debug.stall_s);
    // A stop signal on any rank stops every rank here, together, after a checkpoint (one
    // all-reduce of 4 bytes per step).
    if (const int32_t sig =
            world_.all_reduce_value<int32_t>(StopSignals::received(), ReduceOp::MAX)) {
      try {
        stop_after(step);
      } catch (const Error& e) {  // the signal was not in the log, only the save's error
        BERTH_FAIL(
            "stopping before step {}: {} received, and the checkpoint it saves failed: {}. {}",
            step + 1, StopSignals::name(sig), e.what(),
            saved_at > 0 ? fmt::format("This session's newest checkpoint is {}/{}: continue with "
                                       "--resume once that is fixed",
                                       checkpoint_dir_, checkpoint_dir_name(saved_at))
            : start_step_ > 0
                ? fmt::format("This session saved no checkpoint; it resumed from step {}",
                              start_step_)
                : std::string("This session saved no checkpoint"));
      }
      outcome_ = Outcome::kSignalled;
      outcome_reason_ = fmt::format("{} received", StopSignals::name(sig));
      log_info("stopping before step {}: {}; {}continue with --resume auto", step + 1,
               outcome_reason_,
               step > start_step_ ? "checkpoint " + checkpoint_dir_name(step) + " saved; " : "");
      break;
    }
    // Rank 0 decides for everyone whether this step may start (lease, end of window).
    const LeaseKeeper::Decision decision = lease.before_step(2 * last_step_s, 2 * last_wall);
    if (decision != LeaseKeeper::kContinue) {
      outcome_reason_ = lease.reason();  // on ranks other than 0: "rank 0 … its log says why"
      if (decision == LeaseKeeper::kStopWindow) {
        stop_after(step);
        outcome_ = Outcome::kWindowEnded;
        log_info("stopping before step {}: {}; resume in the next window with --resume auto",
                 step + 1, outcome_reason_);
      } else {
        outcome_ = Outcome::kLeaseLost;
        if (world_.rank() == 0) {  // the one that saw why
          log_warn("stopping before step {} without a checkpoint: the lease is lost ({})", step + 1,
                   outcome_reason_);
        }
      }
      break;
    }
    if (lease.active()) {  // extended or cut short
      progress.set_window_end(lease.window_end(), lease.preempted(), lease.stop_reserve());
    }
    const auto t_step = std::chrono::steady_clock::now();
    const int64_t epoch_before = loader_->rows_consumed() / loader_->rows_per_epoch();
    double initial_val_loss = -1, val_loss = -1;
    const bool last = step == steps - 1;
    const int64_t done = step + 1;
    // Evaluation after every eval.interval-th step and the last one, and once before training.
    const bool initial_eval = cfg_.eval.interval > 0 && step == 0;
    const bool eval = cfg_.eval.interval > 0 && (done % cfg_.eval.interval == 0 || last);
    if (initial_eval) progress.overhead([&] { initial_val_loss = evaluate(); });
    StepStats st = train_step(step);
    if (eval) progress.overhead([&] { val_loss = evaluate(); });
    st.val_loss = val_loss;
    all.push_back(st);
    if (initial_eval) log_info("val loss before training {:.4f}", initial_val_loss);
    // every log_interval-th step from the first, the last, and every step that evaluated (whose
    // validation loss would otherwise reach only metrics.jsonl)
    if (step % cfg_.train.log_interval == 0 || last || eval) {
      log_info(
          "step {:>5}/{} | loss {} | lr {:.3e} | norm {:.4f} | {:.1f} ms | {:.0f} tok/s | "
          "{:.2f} GFLOP/s{}",
          step + 1, steps,
          st.no_targets ? std::string("n/a (no targets)") : fmt::format("{:.4f}", st.loss), st.lr,
          st.grad_norm, st.seconds * 1e3, st.tokens_per_s, st.model_flops_per_s / 1e9,
          val_loss >= 0 ? fmt::format(" | val loss {:.4f}", val_loss) : std::string());
    }
    const bool ckpt = saves_at(done);
    if (ckpt) {
      progress.overhead([&] { lease.checkpoint_took(save(done)); });
      saved_at = done;
    }
    nlohmann::json j = {{"step", done},                {"loss", st.loss},
                        {"lr", st.lr},                 {"grad_norm", st.grad_norm},
                        {"seconds", st.seconds},       {"tokens_per_s", st.tokens_per_s},
                        {"model_flops_per_s", st.model_flops_per_s}};
    if (st.no_targets) j["no_targets"] = true;  // (and "loss": null)
    if (val_loss >= 0) j["val_loss"] = val_loss;
    if (initial_val_loss >= 0) j["initial_val_loss"] = initial_val_loss;
    const bool new_epoch = loader_->rows_consumed() / loader_->rows_per_epoch() != epoch_before;
    progress.end_step(done, st, eval || initial_eval, ckpt, new_epoch, &j);
    if (!st.no_targets) {
      last_wall = seconds_since(t_step);
      last_step_s = st.seconds;
    }
    const std::string line = j.dump() + "\n";
    metrics += line;
    last_line = std::move(j);
    if (writer) {
      partial_line_at = partial.tellp();
      partial << line;
      if (!partial.flush() && !partial_failed) {  // a full disk: said once, when it happens
        partial_failed = true;
        partial_failed_at = done;
        log_warn(
            "metrics: cannot write {} ({}): it stops before step {}; the run goes on and "
            "commits metrics.jsonl at its end from memory (unless it loses its lease), so a "
            "run killed before then loses the records from step {} on (free space in {})",
            partial_path, std::strerror(errno), done, done, run_dir_);
      }
    }
  }
  const double session_s = seconds_since(t_session);
  // Lost after the last check (this process was stopped past the TTL near the end): the files
  // below are another holder's to write.
  if (outcome_ != Outcome::kLeaseLost && lease.confirm_held() == LeaseKeeper::kLost) {
    outcome_ = Outcome::kLeaseLost;
    outcome_reason_ = lease.reason();
    if (world_.rank() == 0)
      log_warn("the lease was lost before the run could end ({})", lease.reason());
  }
  // Past the window's end (a pause outlasted the stop margin) the lease is still this run's, but
  // a launch of a later booking may have resumed in this run directory meanwhile: its token in
  // checkpoint.dir's FENCE says so, and then its files are not this run's to commit.
  int32_t fenced_out = 0;
  std::string fence_why;
  if (writer && outcome_ != Outcome::kLeaseLost && lease.window_over() && fencing_token_) {
    try {
      claim_checkpoint_fence(checkpoint_dir_, *fencing_token_);
    } catch (const Error& e) {
      fenced_out = 1;
      fence_why = e.what();
    }
  }
  world_.broadcast(&fenced_out, 1, DType::I32, 0);
  if (fenced_out != 0) {
    outcome_ = Outcome::kLeaseLost;
    if (writer) outcome_reason_ = fence_why;
    log_warn("the window ended and a later launch took this run directory over ({})",
             writer ? fence_why : "rank 0's log says why");
  }
  if (outcome_ == Outcome::kLeaseLost) {
    // Another launch may hold the lease now and write this run directory (a holder paused past
    // its TTL and taken over): committing trace.csv or metrics.jsonl here would replace its
    // files, or move its trace.csv.partial away under it. Leave everything as it is.
    progress.abandon();
    if (writer) {
      partial.close();
      log_warn(
          "the run directory {} is left as it is: metrics.jsonl and trace.csv are not committed "
          "(this session's steps are in metrics.jsonl.partial and trace.csv.partial), since the "
          "lease is no longer this run's and a launch that takes the booking over may write there",
          run_dir_);
      if (partial_failed) {
        log_warn(
            "metrics: metrics.jsonl.partial lacks this session's steps from {} on (its write "
            "failed), and they are not committed anywhere: they are lost",
            partial_failed_at);
      }
    }
  } else {
    // (a run directory removed after the last save: made again before its files are committed)
    if (writer) relock_run_dir_if_gone("to commit its files");
    progress.finish();
    lease.release();
    if (writer) {
      partial.close();
      try {
        write_file_atomic(metrics_path, metrics);
      } catch (const Error& e) {
        rescue_metrics(metrics, e.what());
      }
      std::remove(partial_path.c_str());
    }
  }
  double seconds = 0;
  for (const StepStats& st : all) seconds += st.seconds;
  {  // measured (every rank takes part) against predicted (rank 0's plan)
    // (heap in use over the trainer's start: below it when no step ran and little was touched)
    const double held = std::max(0.0, held_bytes());
    const double most = world_.all_reduce_value(held, ReduceOp::MAX);
    const int64_t who = world_.all_reduce_value(held == most ? int64_t(world_.rank()) : int64_t(-1),
                                                ReduceOp::MAX);
    if (plan) {
      // The median after the session's first step (its first-touch and warm-up costs); a
      // session of one step has only that one.
      std::vector<double> walls;
      for (size_t i = 1; i < all.size(); ++i) walls.push_back(all[i].seconds);
      std::sort(walls.begin(), walls.end());
      const std::string measured =
          !walls.empty() ? fmt::format("{:.3f} s (median)", walls[walls.size() / 2])
          : all.empty()  ? std::string("none (no step trained)")
                         : fmt::format(
                               "{:.3f} s (the session's only step, its first-step costs "
                                "included)",
                               all[0].seconds);
      log_info(
          "plan vs measured: memory per rank predicted {} (peak stage {}), measured {} held "
          "by rank {} (peak RSS {:.2f} GiB with the runtime) | step predicted {:.3f} s, "
          "measured {}",
          format_bytes(plan->peak.total()), plan->peak_stage, format_bytes(most), who,
          host_peak_rss_gib(), plan->step.total(), measured);
    }
  }
  // A stop signal after the last step's check (during it, or its save) finds the run complete:
  // nothing to continue, exit 0 (a requeue's --resume auto then has nothing to do either).
  if (outcome_ == Outcome::kFinished) {
    if (const int32_t sig =
            world_.all_reduce_value<int32_t>(StopSignals::received(), ReduceOp::MAX)) {
      log_info(
          "{} received after the last step started: the run is complete, nothing to "
          "continue",
          StopSignals::name(sig));
    }
  }
  const std::string where =
      outcome_ == Outcome::kLeaseLost
          ? fmt::format("metrics in {} (not committed: the lease is lost)", partial_path)
          : fmt::format("metrics in {}", metrics_path);
  if (all.empty()) {  // stopped before its first step (a signal during start-up, the window)
    log_info("done: no step trained (stopped before step {}: {}) | {}", start_step_ + 1,
             outcome_reason_, where);
  } else {
    log_info(
        "done: steps {}..{} in {:.2f} s of training steps ({:.2f} s in all, with evaluations, "
        "checkpoint saves and any wait between steps), final loss {:.4f} | {}",
        start_step_ + 1, start_step_ + int64_t(all.size()), seconds, session_s,
        [&] {  // the newest step that had targets
          for (auto it = all.rbegin(); it != all.rend(); ++it)
            if (!it->no_targets) return it->loss;
          return std::numeric_limits<double>::quiet_NaN();
        }(),
        where);
  }
  ckpt_lock_.reset();
  run_lock_.reset();  // the next run in this directory (a test's, a resume) may start
  return all;
}

}  // namespace berth
