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
  int Vp = 0;     // padded vocabulary: V rounded up to a multiple of 128 (128·tp with TP)
  int maxT = 0;   // position-embedding rows

  int HS() const { return C / NH; }
};

// Builds the shape from config values; checks them (positive, C % NH == 0) and pads V to a
// multiple of `vocab_multiple` (128; 128·tp under tensor parallelism, so every vocabulary shard
// is a multiple of 128, as Megatron-LM's make-vocab-size-divisible-by × tp).
GPTConfig make_gpt_config(int64_t n_layer, int64_t n_head, int64_t d_model, int64_t vocab_size,
                          int64_t max_seq_len, int vocab_multiple = 128);
int padded_vocab(int V, int multiple = 128);

// The part of the model one rank holds: a tensor-parallel slice (tp_rank of tp) of the layers of
// one pipeline stage (stage of pp). The default is the whole model.
struct ModelShard {
  int tp = 1, tp_rank = 0, pp = 1, stage = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == pp - 1; }
};

// How a rank's tensor is cut from the full one over tp (Megatron-LM's layout):
//   kNone     replicated (LayerNorm, row-parallel biases, wpe): the whole tensor
//   kRows     rows [r·R/tp, (r+1)·R/tp): column-parallel weights and biases (mlp.c_fc), the
//             vocabulary-parallel wte
//   kCols     columns [r·K/tp, (r+1)·K/tp): row-parallel weights (attn.c_proj, mlp.c_proj)
//   kQKVRows  rows of each of the three C-row blocks (q, k, v) of attn.c_attn: the heads
//             [r·NH/tp, (r+1)·NH/tp) of each, so the local qkv is [q | k | v] of local heads
enum class ShardDim { kNone, kRows, kCols, kQKVRows };

// One named tensor of the flat parameter buffer. GPT-2 names; linear weights are (OC, IC).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, from the start of the flat buffer
  int64_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D weights only)
  // Shard metadata: the full tensor's shape and how this one is cut from it (equal to shape and
  // kNone in a whole model).
  std::vector<int64_t> full_shape;
  ShardDim shard = ShardDim::kNone;
  // Counted once: false for the copies of a tensor another rank also holds (replicated tensors on
  // tp ranks > 0; the tied LM head on the last stage when pp > 1). The global gradient norm sums
  // only these and a checkpoint takes each tensor from the rank where it is unique.
  bool unique = true;
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
// With a shard: the tensors that rank holds, in the same order, with local shapes: the first
// stage has wte and wpe, each stage its layers h.{i} (global names), the last stage ln_f and —
// when pp > 1 — its own copy of wte as the tied LM head (kept equal to the first stage's by
// all-reducing their gradients). Throws unless tp divides NH and Vp and 1 <= pp <= L.
ParamLayout gpt_param_layout(const GPTConfig& cfg, const ModelShard& shard = {});

// Copies this rank's slice of a full tensor (`full` points at the tensor's first element, in
// the full layout) into `local` (spec.numel elements), and back.
template <typename T>
void slice_from_full(const ParamSpec& spec, int tp_rank, const T* full, T* local);
template <typename T>
void place_into_full(const ParamSpec& spec, int tp_rank, const T* local, T* full);

// The same parameters (or optimizer moments) at another vocabulary padding: wte's real rows are
// kept and padded rows are zero; every other tensor is copied. `from` and `to` differ only in Vp.
std::vector<float> repad_vocab(const std::vector<float>& full, const GPTConfig& from,
                               const GPTConfig& to);

// Parameters that count toward model FLOPs: all except the embeddings, plus the tied LM head
// (Vp·C) — i.e. total − wte − wpe + Vp·C.
int64_t gpt_matmul_params(const GPTConfig& cfg);

// Model FLOPs per token for training at sequence length T (forward + backward):
// 6·(non-embedding params + Vp·C) + 12·L·T·C for attention (QKᵀ and attention·V, counted for the
// full T×T, not halved for causality: the CPU kernels compute the full block).
double gpt_flops_per_token(const GPTConfig& cfg, int T);

}  // namespace berth
