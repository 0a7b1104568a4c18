// Real-content tokens trained per second, packed (BFD) vs padded rows, same model and seq_len,
// side by side in one run, on documents with a skewed length distribution (log-normal, median
// ≈ T/8, a tail beyond T).
//
//   bench_packed_training [--steps N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "packing/packers.h"
#include "runtime/model/gpt.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/packed_loader.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kT = 256, kB = 4, kV = 257;

berth::TokenDataset skewed_documents(int n_docs) {
  berth::TokenDataset ds;
  ds.vocab_size = kV;
  ds.eot_token = kV - 1;
  ds.doc_offsets.push_back(0);
  std::mt19937_64 gen(17);
  std::lognormal_distribution<double> len(std::log(kT / 8.0), 1.0);
  for (int d = 0; d < n_docs; d++) {
    const int L = std::max(2, int(len(gen)));
    for (int i = 0; i < L - 1; i++) ds.tokens.push_back(uint32_t(gen() % (kV - 1)));
    ds.tokens.push_back(uint32_t(ds.eot_token));
    ds.doc_offsets.push_back(ds.tokens.size());
  }
  return ds;
}

struct Figures {
  double real_tokens_per_s, efficiency;
  int64_t rows;
};

Figures run(const berth::TokenDataset& ds, berth::PackAlgorithm algorithm, int steps) {
  berth::PackOptions o;
  o.seq_len = kT;
  o.algorithm = algorithm;
  const std::vector<int64_t> lengths = berth::document_lengths(ds);
  const berth::PackPlan plan = berth::pack_documents(lengths, o);
  const berth::PackStats st = berth::pack_stats(plan, lengths);
  const berth::GPTConfig cfg = berth::make_gpt_config(4, 4, 256, kV, kT);
  berth::GPT<float> model(cfg, kB, kT);
  model.init_weights(1);
  berth::AdamW opt(model.layout(), berth::AdamWSettings{});
  berth::PackedLoader loader(&ds, plan, kB, kT, true, 3);
  berth::PackedBatch b;
  int64_t real = 0;
  double seconds = 0;
  for (int s = -1; s < steps; s++) {  // step -1 warms up
    const auto t0 = Clock::now();
    loader.next(&b);
    model.zero_grad();
    model.forward(b);
    model.backward(b, 1.f / float(std::max<int64_t>(1, b.n_targets())));
    const double norm = std::sqrt(berth::cpu::sum_squares(model.grads().data(), int64_t(model.grads().size())));
    opt.step(model.params().data(), model.grads().data(), 1e-4, norm);
    if (s < 0) continue;
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    // real content = the tokens of document pieces in the rows just trained (not padding)
    for (int r = 0; r < kB; r++) {
      const int64_t row = loader.row_of(loader.rows_consumed() - kB + r);
      for (int64_t p = plan.row_offsets[size_t(row)]; p < plan.row_offsets[size_t(row) + 1]; p++) {
        real += plan.pieces[size_t(p)].length;
      }
    }
  }
  return Figures{double(real) / seconds, st.efficiency, plan.n_rows()};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10;
  CLI::App app{"Real-content training tokens/s, packed rows vs one document a padded row"};
  app.add_option("--steps", steps, "Timed training steps of each")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  const berth::TokenDataset ds = skewed_documents(20000);
  std::printf("bench_packed_training: %lld documents, %lld tokens, T=%d, B=%d, model L4 C256 NH4 "
              "V257, %d steps, %d threads\n",
              (long long)ds.n_docs(), (long long)ds.n_tokens(), kT, kB, steps,
              berth::cpu::num_threads());
  const Figures packed = run(ds, berth::PackAlgorithm::BFD, steps);
  const Figures padded = run(ds, berth::PackAlgorithm::PADDED, steps);
  std::printf("%-8s rows %8lld | efficiency %6.2f %% | %9.0f real tokens/s\n", "packed",
              (long long)packed.rows, 100 * packed.efficiency, packed.real_tokens_per_s);
  std::printf("%-8s rows %8lld | efficiency %6.2f %% | %9.0f real tokens/s\n", "padded",
              (long long)padded.rows, 100 * padded.efficiency, padded.real_tokens_per_s);
  std::printf("packed / padded real tokens per second: %.2fx\n",
              packed.real_tokens_per_s / padded.real_tokens_per_s);
  return 0;
}
