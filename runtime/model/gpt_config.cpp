#include "runtime/model/gpt_config.h"

#include <algorithm>

#include "parallel/pipeline.h"
#include "runtime/core/check.h"
#include "runtime/core/limits.h"

namespace berth {

int padded_vocab(int V, int multiple) { return (V + multiple - 1) / multiple * multiple; }

GPTConfig make_gpt_config(int64_t n_layer, int64_t n_head, int64_t d_model, int64_t vocab_size,
                          int64_t max_seq_len, int vocab_multiple) {
  BERTH_CHECK(n_layer > 0 && n_head > 0 && d_model > 0 && vocab_size > 0 && max_seq_len > 0,
              "model sizes must be positive: n_layer={} n_head={} d_model={} vocab_size={} "
              "max_seq_len={}",
              n_layer, n_head, d_model, vocab_size, max_seq_len);
  BERTH_CHECK(d_model % n_head == 0, "model.d_model ({}) must be divisible by model.n_head ({})",
              d_model, n_head);
  BERTH_CHECK(vocab_size < limits::kMaxVocab && d_model < limits::kMaxWidth &&
                  max_seq_len < limits::kMaxSeqLen && n_layer < limits::kMaxLayers &&
                  n_head < limits::kMaxHeads,
              "model sizes too large for this build: n_layer={} n_head={} vocab_size={} "
              "d_model={} max_seq_len={} (each must be below {}, {}, {}, {} and {})",
              n_layer, n_head, vocab_size, d_model, max_seq_len, limits::kMaxLayers,
              limits::kMaxHeads, limits::kMaxVocab, limits::kMaxWidth, limits::kMaxSeqLen);
  GPTConfig c;
  c.L = int(n_layer);
  c.NH = int(n_head);
  c.C = int(d_model);
  c.V = int(vocab_size);
  BERTH_CHECK(vocab_multiple > 0 && vocab_multiple % 128 == 0,
              "the vocabulary padding multiple must be a positive multiple of 128, got {}",
              vocab_multiple);
  c.Vp = padded_vocab(c.V, vocab_multiple);
  c.maxT = int(max_seq_len);
  return c;
}

const ParamSpec& ParamLayout::find(const std::string& name) const {
  for (const ParamSpec& s : specs) {
    if (s.name == name) return s;
  }
  BERTH_FAIL("no parameter named '{}' in this model", name);
}

ParamLayout gpt_param_layout(const GPTConfig& cfg, const ModelShard& sh) {
  BERTH_CHECK(sh.tp >= 1 && sh.tp_rank >= 0 && sh.tp_rank < sh.tp && cfg.NH % sh.tp == 0 &&
                  cfg.Vp % sh.tp == 0,
              "cannot split the model over tp = {} (rank {}): n_head ({}) and the padded "
              "vocabulary ({}) must be divisible by tp",
              sh.tp, sh.tp_rank, cfg.NH, cfg.Vp);
  BERTH_CHECK(sh.pp >= 1 && sh.pp <= cfg.L && sh.stage >= 0 && sh.stage < sh.pp,
              "cannot split {} layers into pipeline stage {} of {}", cfg.L, sh.stage, sh.pp);
  ParamLayout layout;
  const int64_t C = cfg.C, tp = sh.tp;
  const bool lead = sh.tp_rank == 0;  // holds the unique copy of replicated tensors
  auto add = [&](std::string name, std::vector<int64_t> full, ShardDim dim, bool unique) {
    ParamSpec s;
    s.name = std::move(name);
    s.full_shape = full;
    s.shape = std::move(full);
    s.shard = tp > 1 ? dim : ShardDim::kNone;
    if (s.shard == ShardDim::kRows || s.shard == ShardDim::kQKVRows) s.shape[0] /= tp;
    if (s.shard == ShardDim::kCols) s.shape[1] /= tp;
    s.unique = unique && (s.shard != ShardDim::kNone || lead);
    s.numel = 1;
    for (int64_t d : s.shape) s.numel *= d;
    s.offset = layout.total;
    s.decay = s.shape.size() == 2;
    layout.total += s.numel;
    layout.specs.push_back(std::move(s));
  };
  if (sh.first()) {
    add("wte", {cfg.Vp, C}, ShardDim::kRows, true);
    add("wpe", {cfg.maxT, C}, ShardDim::kNone, true);
  }
  const LayerRange layers = stage_layers(cfg.L, sh.pp, sh.stage);
  for (int64_t i = layers.begin; i < layers.end; i++) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {C}, ShardDim::kNone, true);
    add(h + "ln_1.bias", {C}, ShardDim::kNone, true);
    add(h + "attn.c_attn.weight", {3 * C, C}, ShardDim::kQKVRows, true);
    add(h + "attn.c_attn.bias", {3 * C}, ShardDim::kQKVRows, true);
    add(h + "attn.c_proj.weight", {C, C}, ShardDim::kCols, true);
    add(h + "attn.c_proj.bias", {C}, ShardDim::kNone, true);
    add(h + "ln_2.weight", {C}, ShardDim::kNone, true);
    add(h + "ln_2.bias", {C}, ShardDim::kNone, true);
    add(h + "mlp.c_fc.weight", {4 * C, C}, ShardDim::kRows, true);
    add(h + "mlp.c_fc.bias", {4 * C}, ShardDim::kRows, true);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, ShardDim::kCols, true);
    add(h + "mlp.c_proj.bias", {C}, ShardDim::kNone, true);
  }
  if (sh.last()) {
    add("ln_f.weight", {C}, ShardDim::kNone, true);
    add("ln_f.bias", {C}, ShardDim::kNone, true);
    if (!sh.first()) add("wte", {cfg.Vp, C}, ShardDim::kRows, false);  // the tied LM head
  }
  return layout;
}

namespace {

// Calls f(full_offset, local_offset, count) for each contiguous run of a rank's slice.
template <typename F>
void for_each_run(const ParamSpec& s, int tp_rank, F&& f) {
  const int64_t cols = s.full_shape.size() == 2 ? s.full_shape[1] : 1;
  const int64_t rows = s.full_shape[0];
  switch (s.shard) {
    case ShardDim::kNone:
      f(int64_t(0), int64_t(0), s.numel);
      return;
    case ShardDim::kRows: {
      const int64_t n = s.numel;
      f(tp_rank * n, int64_t(0), n);
      return;
    }
    case ShardDim::kQKVRows: {
      const int64_t part = rows / 3, local_rows = s.shape[0] / 3;  // per q, k, v block
      for (int64_t b = 0; b < 3; b++) {
        f((b * part + tp_rank * local_rows) * cols, b * local_rows * cols, local_rows * cols);
      }
      return;
    }
    case ShardDim::kCols: {
      const int64_t local = s.shape[1];
      for (int64_t r = 0; r < rows; r++) f(r * cols + tp_rank * local, r * local, local);
      return;
    }
  }
}

}  // namespace

template <typename T>
void slice_from_full(const ParamSpec& spec, int tp_rank, const T* full, T* local) {
  for_each_run(spec, tp_rank, [&](int64_t fo, int64_t lo, int64_t n) {
    std::copy(full + fo, full + fo + n, local + lo);
  });
}

template <typename T>
void place_into_full(const ParamSpec& spec, int tp_rank, const T* local, T* full) {
  for_each_run(spec, tp_rank, [&](int64_t fo, int64_t lo, int64_t n) {
    std::copy(local + lo, local + lo + n, full + fo);
  });
}

template void slice_from_full<float>(const ParamSpec&, int, const float*, float*);
template void slice_from_full<double>(const ParamSpec&, int, const double*, double*);
template void place_into_full<float>(const ParamSpec&, int, const float*, float*);
template void place_into_full<double>(const ParamSpec&, int, const double*, double*);

std::vector<float> repad_vocab(const std::vector<float>& full, const GPTConfig& from,
                               const GPTConfig& to) {
  BERTH_CHECK(from.L == to.L && from.NH == to.NH && from.C == to.C && from.V == to.V &&
                  from.maxT == to.maxT,
              "repad_vocab: the two models differ in more than the vocabulary padding");
  if (from.Vp == to.Vp) return full;
  const ParamLayout a = gpt_param_layout(from), b = gpt_param_layout(to);
  BERTH_CHECK(int64_t(full.size()) == a.total, "repad_vocab: {} values for a model of {}",
              full.size(), a.total);
  std::vector<float> out(size_t(b.total), 0.f);
  for (size_t i = 0; i < a.specs.size(); i++) {
    const ParamSpec &s = a.specs[i], &t = b.specs[i];
    const int64_t n = s.name == "wte" ? int64_t(from.V) * from.C : s.numel;
    std::copy(full.begin() + s.offset, full.begin() + s.offset + n, out.begin() + t.offset);
  }
  return out;
}

int64_t gpt_matmul_params(const GPTConfig& cfg) {
  const ParamLayout layout = gpt_param_layout(cfg);
  const int64_t embeddings = layout.find("wte").numel + layout.find("wpe").numel;
  return layout.total - embeddings + int64_t(cfg.Vp) * cfg.C;
}

double gpt_flops_per_token(const GPTConfig& cfg, int T) {
  return 6.0 * double(gpt_matmul_params(cfg)) + 12.0 * cfg.L * double(T) * cfg.C;
}

}  // namespace berth
