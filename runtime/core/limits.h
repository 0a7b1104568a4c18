// The largest model and batch sizes this build supports. Kernels index tokens, rows and columns
// with 32-bit ints, so a size beyond these would wrap, not fail: the config (runtime/config) and
// every model source (make_gpt_config: checkpoints, imports) refuse them by these same figures.
#pragma once

#include <cstdint>

namespace berth::limits {

constexpr int64_t kMaxLayers = int64_t{1} << 16;         // model.n_layer <
constexpr int64_t kMaxHeads = int64_t{1} << 16;          // model.n_head <
constexpr int64_t kMaxWidth = int64_t{1} << 20;          // model.d_model <
constexpr int64_t kMaxVocab = int64_t{1} << 30;          // model.vocab_size <
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;         // model.max_seq_len <
constexpr int64_t kMaxTokensPerPass = int64_t{1} << 31;  // micro-batch rows × seq_len <

}  // namespace berth::limits
