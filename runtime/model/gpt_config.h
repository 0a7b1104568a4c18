// GPT-2 model shape and the parameter layout derived from it (pure functions, no allocation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth {

struct GPTConfig {
  int L = 0;      // layers
  int NH = 0;     // heads
  int C = 0;      // d_model
  int V = 0;      // real vocabulary
  int Vp = 0;     // padded vocabulary: V rounded up to a multiple of 128
  int maxT = 0;   // position-embedding rows

  int HS() const { return C / NH; }
};

// Builds the shape from config values; checks them (positive, C % NH == 0) and pads V.
GPTConfig make_gpt_config(int64_t n_layer, int64_t n_head, int64_t d_model, int64_t vocab_size,
                          int64_t max_seq_len);
int padded_vocab(int V);

// One named tensor of the flat parameter buffer. GPT-2 names; linear weights are (OC, IC).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, from the start of the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D weights only)
};

// The layout of all parameters, in GPT-2 order: wte (Vp,C), wpe (maxT,C), then for each layer i
// h.{i}.ln_1.{weight,bias}, h.{i}.attn.c_attn.{weight (3C,C), bias}, h.{i}.attn.c_proj.{weight
// (C,C), bias}, h.{i}.ln_2.{weight,bias}, h.{i}.mlp.c_fc.{weight (4C,C), bias},
// h.{i}.mlp.c_proj.{weight (C,4C), bias}; then ln_f.{weight,bias}.
struct ParamLayout {
  std::vector<ParamSpec> specs;
  int64_t total = 0;

  const ParamSpec& find(const std::string& name) const;  // throws Error when unknown
};
ParamLayout gpt_param_layout(const GPTConfig& cfg);

// Parameters that count toward model FLOPs: all except the embeddings, plus the tied LM head
// (Vp·C) — i.e. total − wte − wpe + Vp·C.
int64_t gpt_matmul_params(const GPTConfig& cfg);

// Model FLOPs per token for training at sequence length T (forward + backward):
// 6·(non-embedding params + Vp·C) + 12·L·T·C for attention (QKᵀ and attention·V, counted for the
// full T×T, not halved for causality: the CPU kernels compute the full block).
double gpt_flops_per_token(const GPTConfig& cfg, int T);

}  // namespace berth
