// bench_packing: packing time, efficiency and padding waste for 10 million synthetic documents.
//
// Lengths are log-normal with median T/8 (T = 1024) and sigma 1, so about 2% of documents are
// longer than T (split into T-token chunks); capped at 8·T. Usage: bench_packing [n_docs] [window]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "packing/packers.h"

namespace {

std::vector<int64_t> lognormal_lengths(size_t n, int64_t T, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto uniform = [&]() { return (double(gen() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<int64_t> out(n);
  for (auto& len : out) {
    const double z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
    len = std::clamp<int64_t>(int64_t(std::llround(double(T) / 8.0 * std::exp(z))), 1, 8 * T);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace berth;
  size_t n = 10'000'000;
  int64_t window = 1000;
  CLI::App app{"Packing time and efficiency of each algorithm on log-normal document lengths"};
  app.add_option("documents", n, "Documents to pack")
      ->check(CLI::Range(size_t(1), size_t(1) << 32));
  app.add_option("window", window, "BFD window, in document pieces")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 32));
  CLI11_PARSE(app, argc, argv);
  constexpr int64_t T = 1024;
  const std::vector<int64_t> lengths = lognormal_lengths(n, T, 42);
  std::vector<int64_t> sorted = lengths;
  std::nth_element(sorted.begin(), sorted.begin() + long(n / 2), sorted.end());
  const auto n_long = std::count_if(lengths.begin(), lengths.end(), [](int64_t l) { return l > T; });
  std::printf("%zu documents, T = %lld, median length %lld, %.2f%% longer than T, window %lld\n", n,
              (long long)T, (long long)sorted[n / 2], 100.0 * double(n_long) / double(n),
              (long long)window);
  std::printf("%-10s %10s %12s %12s %12s\n", "algorithm", "time_s", "rows", "efficiency",
              "pad_waste");
  for (const PackAlgorithm a : {PackAlgorithm::BFD, PackAlgorithm::NEXT_FIT, PackAlgorithm::PADDED}) {
    PackOptions o;
    o.seq_len = T;
    o.algorithm = a;
    o.window = window;
    const auto t0 = std::chrono::steady_clock::now();
    const PackPlan plan = pack_documents(lengths, o);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const PackStats st = pack_stats(plan, lengths);
    std::printf("%-10s %10.3f %12lld %11.2f%% %11.2f%%\n", pack_algorithm_name(a).c_str(), s,
                (long long)st.rows, 100.0 * st.efficiency, 100.0 * st.padding_waste);
  }
  return 0;
}
