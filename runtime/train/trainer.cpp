#include "runtime/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "parallel/data_parallel.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"

namespace berth {

void check_dataset_fits(const TokenDataset& ds, const std::string& path, const RunConfig& cfg) {
  BERTH_CHECK(ds.vocab_size <= cfg.model.vocab_size,
              "dataset '{}' has vocab_size {} but model.vocab_size is {}: raise model.vocab_size "
              "to at least {}",
              path, ds.vocab_size, cfg.model.vocab_size, ds.vocab_size);
  BERTH_CHECK(ds.n_tokens() >= cfg.data.seq_len + 1,
              "dataset '{}' has {} tokens, fewer than data.seq_len + 1 = {}: lower data.seq_len",
              path, ds.n_tokens(), cfg.data.seq_len + 1);
}

Trainer::Trainer(const RunConfig& cfg, Communicator& world) : cfg_(cfg), world_(world) {
  validate_config(cfg_);
  const std::string where = cfg_.source.empty() ? "config" : cfg_.source;
  BERTH_CHECK(!cfg_.data.train.empty(),
              "{}: data.train is not set; point it at a dataset made by `berth data import`",
              where);
  BERTH_CHECK(cfg_.eval.interval == 0 || !cfg_.data.val.empty(),
              "{}: eval.interval is {} but data.val is not set; set data.val or eval.interval = 0",
              where, cfg_.eval.interval);
  // The layout is checked before anything is allocated.
  const GridShape shape = resolve_grid(
      GridRequest{cfg_.parallel.tp, cfg_.parallel.pp, cfg_.parallel.cp, cfg_.parallel.dp},
      world.size(), cfg_.model.n_head, cfg_.model.n_layer);
  grid_ = std::make_unique<ProcessGrid>(world, shape);
  gcfg_ = make_gpt_config(cfg_.model.n_layer, cfg_.model.n_head, cfg_.model.d_model,
                          cfg_.model.vocab_size, cfg_.model.max_seq_len);
  schedule_ = parse_lr_schedule(cfg_.train.lr_schedule);
  const int B = int(cfg_.train.micro_batch_size), T = int(cfg_.data.seq_len);
  const StreamLoader::Shard shard{grid_->coord().dp, shape.dp};

  train_ds_ = read_token_dataset(cfg_.data.train);
  check_dataset_fits(train_ds_, cfg_.data.train, cfg_);
  loader_ = std::make_unique<StreamLoader>(&train_ds_, B, T, cfg_.data.shuffle,
                                           uint64_t(cfg_.run.seed), shard);
  if (!cfg_.data.val.empty()) {
    val_ds_ = read_token_dataset(cfg_.data.val);
    check_dataset_fits(val_ds_, cfg_.data.val, cfg_);
    val_loader_ = std::make_unique<StreamLoader>(&val_ds_, B, T, false, 0, shard);
  }

  model_ = std::make_unique<GPT<float>>(gcfg_, B, T);
  model_->init_weights(uint64_t(cfg_.run.seed));
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
    shard_grads_.assign(size_t(range.size()), 0.f);
  }
  opt_ = std::make_unique<AdamW>(model_->layout(), s, range);
  flops_per_token_ = gpt_flops_per_token(gcfg_, T);
  batches_.resize(size_t(cfg_.parallel.microbatches));
  for (PackedBatch& b : batches_) reset_rows(&b, B, T);
  run_dir_ = (std::filesystem::path(cfg_.run.out_dir) / cfg_.run.name).string();
}

void Trainer::sync_and_update(double lr, StepStats* st) {
  Communicator& g = grid_->dp_cp();
  std::vector<float>& params = model_->params();
  std::vector<float>& grads = model_->grads();
  const int64_t n = int64_t(grads.size());
  if (cfg_.parallel.zero == 1) {
    // ZeRO-1: each rank receives the reduced gradients of its shard, updates its shard of the
    // parameters with its shard of the moments, and the shards are gathered back.
    g.reduce_scatter(grads.data(), shard_grads_.data(), shard_counts_, DType::F32, ReduceOp::SUM);
    const double sq = g.all_reduce_value(
        cpu::sum_squares(shard_grads_.data(), int64_t(shard_grads_.size())), ReduceOp::SUM);
    st->grad_norm = std::sqrt(sq);
    opt_->step(params.data(), shard_grads_.data(), lr, st->grad_norm);
    g.all_gather(params.data() + opt_->range().begin, params.data(), shard_counts_, DType::F32);
  } else {
    all_reduce_gradients(g, grads.data(), n, kGradBucketElems);
    st->grad_norm = std::sqrt(cpu::sum_squares(grads.data(), n));
    opt_->step(params.data(), grads.data(), lr, st->grad_norm);
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
  int64_t local_targets = 0, local_tokens = 0;
  for (PackedBatch& b : batches_) {
    loader_->next(&b);
    local_targets += b.n_targets();
    local_tokens += b.N();
  }
  const int64_t n_targets = g.all_reduce_value(local_targets, ReduceOp::SUM);
  BERTH_CHECK(n_targets > 0, "step {}: the global batch has no target tokens", step);
  model_->zero_grad();
  double loss_sum = 0;
  for (PackedBatch& b : batches_) {
    loss_sum += model_->forward(b);
    model_->backward(b, float(1.0 / double(n_targets)));
  }
  st.loss = g.all_reduce_value(loss_sum, ReduceOp::SUM) / double(n_targets);
  BERTH_CHECK(std::isfinite(st.loss),
              "loss is {} at step {}: training diverged; lower train.lr or enable train.grad_clip",
              st.loss, step);
  sync_and_update(st.lr, &st);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tokens = double(local_tokens) * double(grid_->shape().dp);
  st.tokens_per_s = tokens / st.seconds;
  st.model_flops_per_s = flops_per_token_ * tokens / st.seconds;
  return st;
}

double Trainer::evaluate() {
  BERTH_CHECK(val_loader_ != nullptr, "evaluation needs data.val");
  val_loader_->set_rows_consumed(0);
  PackedBatch& vb = val_batch_;
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < cfg_.eval.batches; i++) {
    val_loader_->next(&vb);
    sum += model_->forward(vb);
    count += vb.n_targets();
  }
  Communicator& g = grid_->dp_cp();
  return g.all_reduce_value(sum, ReduceOp::SUM) / double(g.all_reduce_value(count, ReduceOp::SUM));
}

std::vector<StepStats> Trainer::run() {
  // Rank 0 owns the run directory; a failure there aborts every rank (main → MPI_Abort).
  const bool writer = world_.rank() == 0;
  const std::string resolved = config_to_toml(cfg_);
  if (writer) {
    ensure_writable_dir(run_dir_, "run directory (run.out_dir/run.name)");
    write_text_file_atomic(run_dir_ + "/config.toml", resolved);
  }
  log_info("berth {} | resolved config ({} → {}/config.toml):\n{}", BERTH_VERSION,
           cfg_.source.empty() ? "built-in" : cfg_.source, run_dir_, resolved);
  log_info("model: {} parameters ({:.2f} M), L={} C={} NH={} V={} (padded {}) | batch {}x{} | "
           "{:.1f} MFLOP/token | {} OpenMP threads | activations {:.1f} MiB",
           model_->layout().total, double(model_->layout().total) / 1e6, gcfg_.L, gcfg_.C,
           gcfg_.NH, gcfg_.V, gcfg_.Vp, cfg_.train.micro_batch_size, cfg_.data.seq_len,
           flops_per_token_ / 1e6, omp_get_max_threads(),
           double(model_->activation_bytes()) / (1024.0 * 1024.0));
  log_info("data: {} tokens in {} documents, {} windows of {} (+1) tokens{}", train_ds_.n_tokens(),
           train_ds_.n_docs(), loader_->n_windows(), cfg_.data.seq_len,
           cfg_.data.shuffle ? ", shuffled" : "");
  const GridShape& shape = grid_->shape();
  log_info("layout: {} | global batch {} rows = dp {} x microbatches {} x micro_batch_size {} | "
           "ZeRO-{}{}",
           describe_grid(shape), int64_t(shape.dp) * cfg_.parallel.microbatches *
                                     cfg_.train.micro_batch_size,
           shape.dp, cfg_.parallel.microbatches, cfg_.train.micro_batch_size, cfg_.parallel.zero,
           cfg_.parallel.zero == 1
               ? fmt::format(" (optimizer moments: {} of {} parameters on this rank)",
                             opt_->range().size(), model_->layout().total)
               : std::string());

  // metrics.jsonl: one JSON object per step, rewritten whole at the end via temporary + rename;
  // lines are also appended to a .partial file as the run goes so a live run can be followed.
  const std::string metrics_path = run_dir_ + "/metrics.jsonl";
  const std::string partial_path = metrics_path + ".partial";
  std::ofstream partial;
  if (writer) {
    partial.open(partial_path, std::ios::trunc);
    BERTH_CHECK(partial.good(), "cannot write {}", partial_path);
  }
  std::string metrics;
  std::vector<StepStats> all;
  const int64_t steps = cfg_.train.steps;
  for (int64_t step = 0; step < steps; step++) {
    double val_loss = -1;
    const bool last = step == steps - 1;
    if (cfg_.eval.interval > 0 && (step % cfg_.eval.interval == 0 || last)) val_loss = evaluate();
    StepStats st = train_step(step);
    st.val_loss = val_loss;
    all.push_back(st);
    if (step % cfg_.train.log_interval == 0 || last) {
      log_info("step {:>5}/{} | loss {:.4f} | lr {:.3e} | norm {:.4f} | {:.1f} ms | {:.0f} tok/s | "
               "{:.2f} GFLOP/s{}",
               step + 1, steps, st.loss, st.lr, st.grad_norm, st.seconds * 1e3, st.tokens_per_s,
               st.model_flops_per_s / 1e9,
               val_loss >= 0 ? fmt::format(" | val loss {:.4f}", val_loss) : std::string());
    }
    nlohmann::json j = {{"step", st.step + 1},        {"loss", st.loss},
                        {"lr", st.lr},                {"grad_norm", st.grad_norm},
                        {"seconds", st.seconds},      {"tokens_per_s", st.tokens_per_s},
                        {"model_flops_per_s", st.model_flops_per_s}};
    if (val_loss >= 0) j["val_loss"] = val_loss;
    const std::string line = j.dump() + "\n";
    metrics += line;
    if (writer) {
      partial << line;
      partial.flush();
    }
  }
  if (writer) {
    partial.close();
    write_text_file_atomic(metrics_path, metrics);
    std::remove(partial_path.c_str());
  }
  double seconds = 0;
  for (const StepStats& st : all) seconds += st.seconds;
  log_info("done: {} steps in {:.2f} s, final loss {:.4f} | metrics in {}", steps, seconds,
           all.back().loss, metrics_path);
  return all;
}

}  // namespace berth
