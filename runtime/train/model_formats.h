// Model interop: llm.c model files and Hugging Face GPT-2 safetensors <-> berth CheckpointData.
//
// Pure conversions (no training state): readers return a weights-only CheckpointData (adam_m
// empty, meta.step 0, meta.source "import llmc PATH" / "import hf-gpt2 PATH"); writers take one
// and write atomically (temporary + rename), so a failure never leaves a half-written output.
// Every reader error is a berth::Error that names the file and says what to do; NaN/Inf values
// are not errors but a log_warn naming the tensor (berth name, e.g. "h.0.ln_1.weight").
//
// ---- llm.c model file (.bin) --------------------------------------------------------------------
//   256 little-endian int32 header: [0] magic 20240326, [1] version (3 = fp32, 5 = bf16), [2] maxT,
//   [3] V, [4] L, [5] NH, [6] C, [7] Vp; then 16 tensors, row-major, back to back, each with every
//   layer stacked along a leading L: wte (Vp,C), wpe (maxT,C), ln_1.w (L,C), ln_1.b (L,C),
//   c_attn.w (L,3C,C), c_attn.b (L,3C), attn.c_proj.w (L,C,C), attn.c_proj.b (L,C), ln_2.w (L,C),
//   ln_2.b (L,C), c_fc.w (L,4C,C), c_fc.b (L,4C), mlp.c_proj.w (L,C,4C), mlp.c_proj.b (L,C),
//   ln_f.w (C), ln_f.b (C). Weights are (out, in) like berth's, so only the order changes.
//   Vp: berth pads V to a multiple of 128 (padded_vocab), as llm.c does. A file whose Vp differs
//   but is >= V is accepted and re-padded (rows >= V dropped, berth's padding rows zero; a warning
//   when a dropped row was non-zero); Vp < V is an error.
//
// ---- Hugging Face GPT-2 (model.safetensors + config.json) ---------------------------------------
//   safetensors: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
//   data_offsets: [begin, end)}, "__metadata__": {...}}, then the data (offsets relative to its
//   start). Read: F32, F16, BF16. Names with or without the "transformer." prefix: wte.weight
//   (V,C), wpe.weight (maxT,C), h.{i}.ln_1/ln_2.{weight,bias} (C), h.{i}.attn.c_attn.weight (C,3C),
//   .bias (3C), h.{i}.attn.c_proj.weight (C,C), h.{i}.mlp.c_fc.weight (C,4C),
//   h.{i}.mlp.c_proj.weight (4C,C), biases (out), ln_f.{weight,bias} (C). Conv1D weights are stored
//   (in, out) and are transposed to berth's (out, in). The attn.bias / attn.masked_bias buffers are
//   ignored, and so is lm_head.weight (tied to wte; a warning when it differs). config.json gives
//   n_layer, n_head, n_embd, vocab_size, n_positions.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/train/checkpoint.h"

namespace berth {

constexpr int32_t kLlmcModelMagic = 20240326;
constexpr int32_t kLlmcModelVersionFp32 = 3;
constexpr int32_t kLlmcModelVersionBf16 = 5;

// Reads an llm.c model file (version 3 or 5). Errors: missing file, truncated header, wrong magic
// (a token file, magic 20240520, is named as such), unsupported version, header values that make
// no model (non-positive, C % NH != 0, Vp < V), file size that disagrees with the header.
CheckpointData read_llmc_model(const std::string& path);

// Writes `data`'s weights as an llm.c model file, version 3 (fp32), Vp = padded_vocab(V).
// Atomic: `path` is either the complete file or untouched.
void write_llmc_model(const std::string& path, const CheckpointData& data);
// Whether `path` is a regular file that starts with the llm.c model magic (an earlier export that
// a new one may replace; any other file is not berth's to overwrite).
bool is_llmc_model_file(const std::string& path);

// Reads Hugging Face GPT-2 weights: `dir_or_file` is a directory holding model.safetensors and
// config.json, or the .safetensors file itself (config.json next to it). The vocabulary is padded
// to Vp with zero rows of wte. Errors: missing files, truncated file or header, header length past
// the end of the file, invalid JSON, unsupported dtype, data_offsets outside the data or
// disagreeing with dtype x shape, missing tensor, wrong shape, config.json missing a key.
CheckpointData read_hf_gpt2(const std::string& dir_or_file);

// Writes `out_dir`/model.safetensors (F32, names without the "transformer." prefix, Conv1D
// weights (in, out), wte's V real rows only; no lm_head: tied) and `out_dir`/config.json.
// When `out_dir` does not exist it is built as a temporary directory and renamed into place;
// when it exists (e.g. it holds tokenizer files) the two files are written as temporaries in it
// and renamed. Either way no partial output is left on failure.
void write_hf_gpt2(const std::string& out_dir, const CheckpointData& data);

// Half-precision conversions used by the readers (exact; NaN stays NaN, Inf stays Inf).
float bf16_to_float(uint16_t bits);  // bf16 is the high 16 bits of an fp32
float f16_to_float(uint16_t bits);   // IEEE binary16, subnormals included

}  // namespace berth
