// The largest sizes, step counts and durations this build supports, in one place for the layers
// that check them: kernels index tokens, rows and columns with 32-bit ints, so a size beyond these
// would wrap, not fail; the config (runtime/config), every model source (make_gpt_config:
// checkpoints, imports) and the progress predictor refuse them by these same figures.
#pragma once

#include <cstdint>

namespace berth::limits {

constexpr int64_t kMaxLayers = int64_t{1} << 16;         // model.n_layer <
constexpr int64_t kMaxHeads = int64_t{1} << 16;          // model.n_head <
constexpr int64_t kMaxWidth = int64_t{1} << 20;          // model.d_model <
constexpr int64_t kMaxVocab = int64_t{1} << 30;          // model.vocab_size <
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;         // model.max_seq_len <
constexpr int64_t kMaxCount = int64_t{1} << 31;          // rows, micro-batches, batches, ranks <
constexpr int64_t kMaxTokensPerPass = kMaxCount;         // micro-batch rows × seq_len <
// A step's tokens (dp × microbatches × micro-batch rows × seq_len) <: real runs take ~2^22; the
// plan multiplies it by up to 2^16 devices' worth of layouts in int64.
constexpr int64_t kMaxTokensPerStep = int64_t{1} << 46;
// The most global steps a run may have: the predictor forecasts the remaining steps one by one
// (10^8 take about a second). Real runs have 10^4..10^6.
constexpr int64_t kMaxSteps = 100'000'000;  // train.steps <=
// The longest duration anything waits for or a step may take: 10^9 s, 31 years (seconds become
// int64 nanoseconds in clocks; 1e300 s would wrap).
constexpr double kMaxSeconds = 1e9;

}  // namespace berth::limits
