// Training equivalence against one rank, shared by the data/context-parallel and the
// tensor/pipeline-parallel tests: train a config for its steps, then compare every loss (1e-5
// relative) and the final parameters (relative L2 and element-wise, tests/tolerance.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/config/config.h"
#include "runtime/train/trainer.h"
#include "tests/tolerance.h"

namespace berth::test {

struct TrainedRun {
  std::vector<double> losses;  // every step's loss (the same on every rank)
  // The whole model after the last step, in gpt_param_layout order: gathered from every slice and
  // stage on rank 0 of the run's communicator; on other ranks this rank's copy when it holds the
  // whole model (tp = pp = 1), else empty.
  std::vector<float> params;
};

// `be` (optional): the backend to train on (tests/host_items_backend.h), else run.device's.
inline TrainedRun train_run(const RunConfig& cfg, Communicator& comm, Backend* be = nullptr) {
  Trainer t(cfg, comm, be);
  TrainedRun r;
  for (int64_t s = 0; s < cfg.train.steps; s++) r.losses.push_back(t.train_step(s).loss);
  std::vector<float> whole = t.full_params();  // collective
  if (comm.rank() == 0) {
    r.params = std::move(whole);
  } else if (cfg.parallel.tp == 1 && cfg.parallel.pp == 1) {
    r.params = t.model().params_host();
  }
  return r;
}

// The key part of every attn.c_attn.bias gets a gradient that is exactly zero in exact
// arithmetic (softmax is invariant to adding q·b_k to a whole row of scores), so in fp32 it is
// rounding noise, which AdamW normalizes into O(lr) steps: those values depend on summation order
// and on nothing else, and are left out of the comparison (they cannot change any loss).
inline void drop_key_bias(const RunConfig& c, std::vector<double>* p) {
  const GPTConfig g = make_gpt_config(c.model.n_layer, c.model.n_head, c.model.d_model,
                                      c.model.vocab_size, c.model.max_seq_len);
  const ParamLayout layout = gpt_param_layout(g);
  for (int l = 0; l < g.L; l++) {
    const ParamSpec& b = layout.find("h." + std::to_string(l) + ".attn.c_attn.bias");
    for (int64_t i = g.C; i < 2 * g.C; i++) (*p)[size_t(b.offset + i)] = 0;
  }
}

// `ref` is the one-rank run (empty on ranks that did not train it: nothing to compare there);
// `shape` is a config of the model's shape. Parameters are compared where `got` holds them: in
// relative L2 norm, and element-wise unless `params` is null. The bounds default to fp32's.
inline void expect_same_training(const TrainedRun& got, const TrainedRun& ref,
                                 const RunConfig& shape, const std::string& what,
                                 const Tol& losses = kDataParallelLoss,
                                 double params_l2 = kDataParallelParamsL2,
                                 const Tol* params = &kDataParallelParams) {
  if (ref.losses.empty()) return;
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  expect_close(got.losses.data(), ref.losses.data(), int64_t(ref.losses.size()), losses,
               what.c_str());
  if (got.params.empty()) return;  // a slice: rank 0 compares the whole model
  std::vector<double> a(got.params.begin(), got.params.end());
  std::vector<double> b(ref.params.begin(), ref.params.end());
  ASSERT_EQ(a.size(), b.size()) << what << ": whole parameter count";
  drop_key_bias(shape, &a);
  drop_key_bias(shape, &b);
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < a.size(); i++) {
    diff2 += (a[i] - b[i]) * (a[i] - b[i]);
    ref2 += b[i] * b[i];
  }
  const double rel_l2 = std::sqrt(diff2 / ref2);
  if (std::getenv("BERTH_TOL_REPORT") != nullptr) {
    std::printf("[tol] %s params rel L2 %.2g\n", what.c_str(), rel_l2);
  }
  EXPECT_LE(rel_l2, params_l2) << what << ": ||params − reference|| / ||reference||";
  if (params != nullptr) expect_close(a.data(), b.data(), int64_t(b.size()), *params, what.c_str());
}

}  // namespace berth::test
