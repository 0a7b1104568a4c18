#include "runtime/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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

Trainer::Trainer(const RunConfig& cfg) : cfg_(cfg) {
  validate_config(cfg_);
  BERTH_CHECK(!cfg_.data.train.empty(),
              "{}: data.train is not set; point it at a dataset made by `berth data import`",
              cfg_.source.empty() ? "config" : cfg_.source);
  BERTH_CHECK(cfg_.eval.interval == 0 || !cfg_.data.val.empty(),
              "{}: eval.interval is {} but data.val is not set; set data.val or eval.interval = 0",
              cfg_.source.empty() ? "config" : cfg_.source, cfg_.eval.interval);
  gcfg_ = make_gpt_config(cfg_.model.n_layer, cfg_.model.n_head, cfg_.model.d_model,
                          cfg_.model.vocab_size, cfg_.model.max_seq_len);
  schedule_ = parse_lr_schedule(cfg_.train.lr_schedule);
  const int B = int(cfg_.train.micro_batch_size), T = int(cfg_.data.seq_len);

  train_ds_ = read_token_dataset(cfg_.data.train);
  check_dataset_fits(train_ds_, cfg_.data.train, cfg_);
  loader_ = std::make_unique<StreamLoader>(&train_ds_, B, T, cfg_.data.shuffle,
                                           uint64_t(cfg_.run.seed));
  if (!cfg_.data.val.empty()) {
    val_ds_ = read_token_dataset(cfg_.data.val);
    check_dataset_fits(val_ds_, cfg_.data.val, cfg_);
    val_loader_ = std::make_unique<StreamLoader>(&val_ds_, B, T, false, 0);
  }

  model_ = std::make_unique<GPT<float>>(gcfg_, B, T);
  model_->init_weights(uint64_t(cfg_.run.seed));
  AdamWSettings s;
  s.beta1 = cfg_.train.beta1;
  s.beta2 = cfg_.train.beta2;
  s.eps = cfg_.train.eps;
  s.weight_decay = cfg_.train.weight_decay;
  s.grad_clip = cfg_.train.grad_clip;
  opt_ = std::make_unique<AdamW>(model_->layout(), s);
  flops_per_token_ = gpt_flops_per_token(gcfg_, T);
  reset_rows(&batch_, B, T);
  run_dir_ = (std::filesystem::path(cfg_.run.out_dir) / cfg_.run.name).string();
}

StepStats Trainer::train_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats st;
  st.step = step;
  st.lr = lr_at(step, cfg_.train.steps, cfg_.train.lr, cfg_.train.min_lr, cfg_.train.warmup_steps,
                schedule_);
  loader_->next(&batch_);
  const int64_t n_targets = batch_.n_targets();
  BERTH_CHECK(n_targets > 0, "step {}: the batch has no target tokens", step);
  model_->zero_grad();
  const double loss_sum = model_->forward(batch_);
  st.loss = loss_sum / double(n_targets);
  BERTH_CHECK(std::isfinite(st.loss),
              "loss is {} at step {}: training diverged; lower train.lr or enable train.grad_clip",
              st.loss, step);
  model_->backward(batch_, float(1.0 / double(n_targets)));
  st.grad_norm = opt_->step(model_->params(), model_->grads(), st.lr);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tokens = double(batch_.N());
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
  return sum / double(count);
}

std::vector<StepStats> Trainer::run() {
  ensure_writable_dir(run_dir_, "run directory (run.out_dir/run.name)");
  const std::string resolved = config_to_toml(cfg_);
  write_text_file_atomic(run_dir_ + "/config.toml", resolved);
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

  // metrics.jsonl: one JSON object per step, rewritten whole at the end via temporary + rename;
  // lines are also appended to a .partial file as the run goes so a live run can be followed.
  const std::string metrics_path = run_dir_ + "/metrics.jsonl";
  const std::string partial_path = metrics_path + ".partial";
  std::ofstream partial(partial_path, std::ios::trunc);
  BERTH_CHECK(partial.good(), "cannot write {}", partial_path);
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
    partial << line;
    partial.flush();
  }
  partial.close();
  write_text_file_atomic(metrics_path, metrics);
  std::remove(partial_path.c_str());
  double seconds = 0;
  for (const StepStats& st : all) seconds += st.seconds;
  log_info("done: {} steps in {:.2f} s, final loss {:.4f} | metrics in {}", steps, seconds,
           all.back().loss, metrics_path);
  return all;
}

}  // namespace berth
