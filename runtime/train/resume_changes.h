// What changed, between the run that saved a checkpoint and the run resuming from it, in what
// decides the rest of the run beyond the weights: the data order (which rows the checkpoint's
// rows_consumed points at), the global batch, and the learning-rate schedule over the steps both
// runs train. Other changes (the layout, logging,
// checkpoint interval) are free on resume. Pure; the trainer logs the result as a warning.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config/config.h"

namespace berth {

// "" when nothing of the kind changed; otherwise one sentence per kind, for example
//   "the data order differs from the saved run's (data.seq_len 128 → 256; rows_consumed 640 now
//   points at other rows)" and "the learning rate of step 21 is 2.30e-03 where the saved run's
//   schedule gives 3.70e-04 (train.steps 20 → 40)". The data file is the same when its
//   fingerprints match (whatever its path now), or without them when the paths resolve alike.
// `saved_rows_per_step` / `now_rows_per_step`: global rows of one optimizer step (0 = unknown);
// `step`: the checkpoint's step (the next step to run is step + 1); `rows_consumed`: its data
// position; `saved_data` / `now_data`: the data.train fingerprints (dataset_fingerprint; "" =
// unknown), compared when the path is the same (a dataset re-imported or replaced there).
std::string describe_resume_changes(const RunConfig& saved, int64_t saved_rows_per_step,
                                    const RunConfig& now, int64_t now_rows_per_step, int64_t step,
                                    int64_t rows_consumed, const std::string& saved_data = "",
                                    const std::string& now_data = "");

}  // namespace berth
