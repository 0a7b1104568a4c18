#include "runtime/train/progress_tracker.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/comm/communicator.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/model/gpt_config.h"
#include "runtime/train/step_metrics.h"
#include "runtime/train/trainer.h"

namespace berth {
namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// A checkpoint's prior until the first save is measured: a fixed cost (files created, synced and
// renamed: this repo's dev VM saved the tiny config's 10 MB in 0.08-0.12 s on 2026-12-07, the
// files written in the checksummed HDF5 1.10 format) and a write rate (a parallel filesystem's
// share per writer is often lower, a local NVMe disk higher).
constexpr double kCheckpointPriorFixedS = 0.1;
constexpr double kCheckpointPriorBytesPerS = 0.5e9;
}  // namespace

ProgressTracker::ProgressTracker(const RunConfig& cfg, ProcessGrid& grid,
                                 const std::string& run_dir, int64_t start_step,
                                 int64_t tokens_per_step, double flops_per_token,
                                 double window_end_unix, int64_t reservation,
                                 const Backend* backend)
    : cfg_(cfg),
      grid_(grid),
      backend_(backend),
      run_dir_(run_dir),
      start_step_(start_step),
      tokens_per_step_(tokens_per_step) {
  Communicator& world = grid.world();
  const std::vector<std::string> names = gather_rank_names(world);
  const int ranks_on_host = mpi_local_rank().size;  // collective
  session_start_unix_ = unix_now();
  if (world.rank() == 0) {
    RunFacts f;
    f.max_steps = cfg.train.steps;
    f.start_step = start_step;
    f.session_steps = cfg.train.steps - start_step;
    f.ckpt_interval = cfg.checkpoint.interval;
    f.eval_interval = cfg.eval.interval;
    f.schedule = {ScheduleEntry{0, cfg.data.seq_len, tokens_per_step}};
    f.hidden_size = cfg.model.d_model;
    const Backend::DeviceMemory dm = backend_ ? backend_->device_memory() : Backend::DeviceMemory{};
    f.mem_capacity_gib = cfg.progress.mem_capacity_gib > 0 ? cfg.progress.mem_capacity_gib
                         : dm.total > 0                    ? double(dm.total) / kGiB
                                        : host_capacity_gib_per_rank(ranks_on_host);
    f.warmup_steps = cfg.progress.warmup_steps;
    // checkpoint.final = false: the last step saves as any other (a multiple of the interval).
    f.final_ckpt = cfg.checkpoint.final ? 1 : -1;
    f.final_eval = cfg.eval.interval > 0 ? 1 : 0;
    // Priors of the event costs, until the first is seen: a save writes the fp32 weights and
    // AdamW's two moments (12 bytes a parameter); an evaluation runs eval.batches forward passes
    // of dp × micro_batch_size rows, where a step runs microbatches forward and backward passes
    // (a forward about a third of both).
    const int64_t params =
        gpt_param_layout(make_gpt_config(cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model,
                                         cfg.model.vocab_size, cfg.model.max_seq_len))
            .total;
    f.ckpt_prior_s = kCheckpointPriorFixedS + 12.0 * double(params) / kCheckpointPriorBytesPerS;
    f.eval_prior_steps =
        double(cfg.eval.batches) / (3.0 * double(std::max<int64_t>(1, cfg.parallel.microbatches)));
    MonitorSettings s;
    s.rank_names = names;
    if (grid.shape().pp > 1) {
      for (int r = 0; r < int(names.size()); ++r)
        s.rank_stage.push_back(grid_coord(grid.shape(), r).pp);
    }
    s.flops_per_token = flops_per_token;
    s.peak_flops_per_rank = cfg.progress.peak_tflops * 1e12;
    s.session_start_unix = session_start_unix_;
    if (reservation > 0) s.reservation = std::to_string(reservation);
    monitor_ = std::make_unique<ProgressMonitor>(f, s);
    if (window_end_unix > 0 || !cfg.progress.window_end.empty()) {
      window_end_unix_ =
          window_end_unix > 0 ? window_end_unix : parse_utc_time(cfg.progress.window_end);
      if (window_end_unix_ <= session_start_unix_) {
        log_warn(
            "the window end {} has already passed: the window warning is active from the "
            "first block (logged then, and every 10th block while it lasts)",
            format_utc_iso(window_end_unix_));
      }
      monitor_->set_window_end(window_end_unix_);  // and the facts' lease_s
    }
    const std::string trace = run_dir_ + "/trace.csv";
    const std::string facts = run_dir_ + "/run_facts.json";
    std::error_code ec;
    std::string kept_facts;  // the newest archived trace's facts go beside it
    for (const std::string& old : {trace, trace + ".partial"}) {
      if (start_step > 0 && std::filesystem::exists(old, ec)) {
        // A second resume from the same step must not replace the first one's trace.
        std::string suffix = fmt::format("before-{}", start_step);
        for (int n = 2; std::filesystem::exists(run_dir_ + "/trace." + suffix + ".csv", ec); ++n)
          suffix = fmt::format("before-{}.{}", start_step, n);
        // A killed session's last row can be cut short: the archive keeps whole rows only, so
        // that it replays (`line 14: 8 fields, expected 10`).
        trim_to_whole_lines(old);
        std::filesystem::rename(old, run_dir_ + "/trace." + suffix + ".csv", ec);
        kept_facts = run_dir_ + "/run_facts." + suffix + ".json";
      }
    }
    // Its session's facts, which this session's replace (the archived trace could not be
    // replayed against anything).
    if (!kept_facts.empty() && std::filesystem::exists(facts, ec)) {
      std::filesystem::rename(facts, kept_facts, ec);
    }
    write_file_atomic(facts, run_facts_to_json(monitor_->predictor().facts()));
    // A new file, not the old one truncated: a holder that lost the lease may still have that one
    // open, and its writes must not land in this run's trace.
    std::filesystem::remove(trace + ".partial", ec);
    trace_.open(trace + ".partial", std::ios::trunc);
    BERTH_CHECK(trace_.good(), "cannot write {}.partial: {}", trace, std::strerror(errno));
    trace_id_ = file_id(trace + ".partial");
    trace_ << trace_csv_header();
    tty_ = isatty(STDOUT_FILENO) != 0;
  }
  mark_ = std::chrono::steady_clock::now();
  comm_mark_ = grid_.comm_seconds();
}

void ProgressTracker::set_window_end(double window_end_unix, bool preempted,
                                     double stop_reserve_s) {
  if (!monitor_ || window_end_unix <= 0) return;
  if (window_end_unix == window_end_unix_ && stop_reserve_s == stop_reserve_s_) return;
  const bool moved = window_end_unix != window_end_unix_;
  window_end_unix_ = window_end_unix;
  stop_reserve_s_ = stop_reserve_s;
  monitor_->set_window_end(window_end_unix, preempted, stop_reserve_s);
  if (!moved) return;  // the facts' lease_s is the window's
  write_file_atomic(run_dir_ + "/run_facts.json", run_facts_to_json(monitor_->predictor().facts()));
}

void ProgressTracker::end_step(int64_t done, const StepStats& st, bool evaluated,
                               bool checkpointed, bool new_epoch, nlohmann::json* line) {
  const auto now = std::chrono::steady_clock::now();
  RankStepMetrics m;
  m.wall_s = std::chrono::duration<double>(now - mark_).count();
  m.comm_s = std::max(0.0, grid_.comm_seconds() - comm_mark_ - overhead_comm_s_);
  // Time blocked in pipeline transfers: the bubble, a part of comm_s (the pp group's seconds).
  m.bubble_s = std::min(st.bubble_s, m.comm_s);
  m.data_wait_s = st.data_wait_s;
  m.overhead_s = overhead_s_;
  m.compute_s = std::max(0.0, m.wall_s - m.comm_s - m.data_wait_s - m.overhead_s);
  // Each rank counts its share of the global batch's tokens, so the sum over ranks is the whole.
  m.tokens = double(st.tokens) / double(grid_.world().size());
  const Backend::DeviceMemory dm = backend_ ? backend_->device_memory() : Backend::DeviceMemory{};
  if (dm.total > 0) {  // a GPU: its allocator's figures and what the device has left
    m.mem_gib = double(backend_->bytes_in_use()) / kGiB;
    m.mem_peak_gib = double(backend_->peak_bytes()) / kGiB;
    m.device_free_gib = double(dm.free) / kGiB;
  } else {
    m.mem_gib = host_rss_gib();
    m.mem_peak_gib = host_peak_rss_gib();
  }
  m.gather_s = last_gather_s_;
  // The next step starts now: the gather below is communication of the next step.
  mark_ = now;
  comm_mark_ = grid_.comm_seconds();
  overhead_s_ = 0;
  overhead_comm_s_ = 0;
  const auto g0 = std::chrono::steady_clock::now();
  const std::vector<RankStepMetrics> all = gather_step_metrics(grid_.world(), m);
  last_gather_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
  if (!monitor_) return;
  // The cost of the previous gather: the time of the rank that arrived last (the others also
  // waited for it), i.e. the smallest time over ranks.
  double gather_s = all.front().gather_s;
  for (const RankStepMetrics& r : all) gather_s = std::min(gather_s, r.gather_s);
  if (done > start_step_ + 1) {
    gather_s_ += gather_s;
    walls_s_ += m.wall_s;
    ++steps_;
  }

  std::string event = done == start_step_ + 1 ? (start_step_ > 0 ? "resume" : "first_step") : "";
  auto add = [&](const char* e) { event += event.empty() ? e : std::string("+") + e; };
  if (checkpointed) add("ckpt");
  if (evaluated) add("eval");
  if (new_epoch) add("epoch_boundary");
  const int64_t global_tokens = st.tokens;
  const StepRecord& r = monitor_->observe(done, all, global_tokens, cfg_.data.seq_len, event);
  last_row_at_ = trace_.tellp();  // (a stop's save rewrites the row from there)
  trace_ << trace_csv_row(r);
  if (!trace_.flush() && !trace_failed_) {  // a full disk: said once, when it happens
    trace_failed_ = true;
    log_warn(
        "progress: cannot write {}/trace.csv.partial ({}): it stops before step {}, and "
        "trace.csv is not committed at the end (free space there to keep the next run's)",
        run_dir_, std::strerror(errno), done);
  }

  nlohmann::json& j = *line;
  j["wall_s"] = r.duration_s;
  j["compute_s"] = r.compute_s;
  j["comm_s"] = r.comm_s;
  j["data_wait_s"] = r.data_wait_s;
  double bubble = 0;  // mean over ranks
  for (const RankStepMetrics& k : all) bubble += k.bubble_s / double(all.size());
  j["bubble_s"] = bubble;
  j["overhead_s"] = r.overhead_s;
  j["tokens"] = r.tokens;
  j["mem_gib"] = r.mem_gib;
  double peak = 0;  // the highest of the ranks' high-water marks so far
  for (const RankStepMetrics& k : all) peak = std::max(peak, k.mem_peak_gib);
  j["mem_peak_gib"] = peak;
  if (dm.total > 0) {  // the least free memory of any rank's device
    double free = all.front().device_free_gib;
    for (const RankStepMetrics& k : all) free = std::min(free, k.device_free_gib);
    j["device_free_gib"] = free;
  }
  j["gather_s"] = gather_s;  // the previous step's gather
  if (!r.event.empty()) j["event"] = r.event;
  double slowest = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].wall_s - all[k].comm_s > slowest) {
      slowest = all[k].wall_s - all[k].comm_s;
      j["slowest_rank"] = int64_t(k);
    }
  }

  const int64_t end = cfg_.train.steps;
  if ((done - start_step_) % cfg_.progress.interval != 0 && done != end) return;
  log_block(done, line);
}

void ProgressTracker::log_block(int64_t done, nlohmann::json* line) {
  nlohmann::json& j = *line;
  const ProgressReport rep = monitor_->report();
  const Prediction& p = rep.prediction;
  j["predicted_total_s"] = p.total_s;
  j["predicted_remaining_s"] = p.remaining_s;
  j["predicted_low_s"] = p.low_s;
  j["predicted_high_s"] = p.high_s;
  // At every block, [] when none is active: a reader can tell "no warning" from "no block".
  nlohmann::json names = nlohmann::json::array();
  for (const ProgressWarning& x : rep.warnings) names.push_back(warning_name(x.kind));
  j["warnings"] = names;
  log_info("{}", format_progress(rep, session_start_unix_, tty_));
  for (const ProgressWarning& w : monitor_->due(rep)) log_warn("[progress] {}", w.message);
  last_block_step_ = done;
}

void ProgressTracker::stopped_after(int64_t done, double save_s, nlohmann::json* line) {
  if (!monitor_) return;
  if (save_s > 0) {
    const StepRecord& r = monitor_->amend_last(save_s, "ckpt");
    // The row, rewritten in place. (A trace that could not be written is left as it is: the stop
    // is not failed for it.)
    const std::string partial = run_dir_ + "/trace.csv.partial";
    if (!trace_failed_ &&
        !rewrite_from(trace_, partial, trace_id_, last_row_at_, trace_csv_row(r))) {
      trace_failed_ = true;  // not committed whole (cut where the row began, or not this run's)
      if (file_id(partial) != trace_id_) {
        log_warn(
            "progress: {} is another launch's file now (it took the run directory over); "
            "left alone",
            partial);
      } else {
        log_warn("progress: cannot rewrite the last row of {}; metrics.jsonl has the stop's save",
                 partial);
      }
    }
    nlohmann::json& j = *line;
    j["wall_s"] = r.duration_s;
    j["overhead_s"] = r.overhead_s;
    j["event"] = r.event;
  }
  if (last_block_step_ != done) log_block(done, line);
}

void ProgressTracker::finish() {
  if (!monitor_) return;
  const bool whole = !trace_failed_ && trace_.flush();
  trace_.close();
  const std::string trace = run_dir_ + "/trace.csv";
  // A trace cut by a full disk is not committed as whole (it would not replay: a row cut short).
  if (!whole || trace_.fail()) {
    log_warn(
        "progress: {}.partial could not be written whole (disk full?); trace.csv is not "
        "committed",
        trace);
    return;
  }
  // A run directory removed during the run took the .partial with it: said, and not fatal (the
  // error ended the run before metrics.jsonl, written from memory next, was committed).
  try {
    commit_file(trace + ".partial", trace);
  } catch (const Error& e) {
    log_warn("progress: trace.csv is not committed: {}", e.what());
    return;
  }
  if (steps_ > 0 && walls_s_ > 0) {
    log_info("progress: trace of this session in {} (replay: berth eta replay {} --meta {}/"
             "run_facts.json) | gathering the per-rank records cost {:.0f} us per step ({:.3f}% "
             "of step time)",
             trace, trace, run_dir_, gather_s_ / double(steps_) * 1e6, gather_s_ / walls_s_ * 100);
  }
}

void ProgressTracker::abandon() {
  if (!monitor_) return;
  trace_.close();
}

}  // namespace berth
