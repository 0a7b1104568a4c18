#include "runtime/model/gpt_config.h"

#include "runtime/core/check.h"

namespace berth {

int padded_vocab(int V) { return (V + 127) / 128 * 128; }

GPTConfig make_gpt_config(int64_t n_layer, int64_t n_head, int64_t d_model, int64_t vocab_size,
                          int64_t max_seq_len) {
  BERTH_CHECK(n_layer > 0 && n_head > 0 && d_model > 0 && vocab_size > 0 && max_seq_len > 0,
              "model sizes must be positive: n_layer={} n_head={} d_model={} vocab_size={} "
              "max_seq_len={}",
              n_layer, n_head, d_model, vocab_size, max_seq_len);
  BERTH_CHECK(d_model % n_head == 0, "model.d_model ({}) must be divisible by model.n_head ({})",
              d_model, n_head);
  BERTH_CHECK(vocab_size < (int64_t(1) << 30) && d_model < (int64_t(1) << 20) &&
                  max_seq_len < (int64_t(1) << 24),
              "model sizes too large for this build: vocab_size={} d_model={} max_seq_len={}",
              vocab_size, d_model, max_seq_len);
  GPTConfig c;
  c.L = int(n_layer);
  c.NH = int(n_head);
  c.C = int(d_model);
  c.V = int(vocab_size);
  c.Vp = padded_vocab(c.V);
  c.maxT = int(max_seq_len);
  return c;
}

const ParamSpec& ParamLayout::find(const std::string& name) const {
  for (const ParamSpec& s : specs) {
    if (s.name == name) return s;
  }
  BERTH_FAIL("no parameter named '{}' in this model", name);
}

ParamLayout gpt_param_layout(const GPTConfig& cfg) {
  ParamLayout layout;
  const int64_t C = cfg.C;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParamSpec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.numel = 1;
    for (int64_t d : s.shape) s.numel *= d;
    s.offset = layout.total;
    s.decay = s.shape.size() == 2;
    layout.total += s.numel;
    layout.specs.push_back(std::move(s));
  };
  add("wte", {cfg.Vp, C});
  add("wpe", {cfg.maxT, C});
  for (int i = 0; i < cfg.L; i++) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * C, C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {4 * C, C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {C, 4 * C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return layout;
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
