// Packers (packing/packers.h) and plan files (packing/plan_cache.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "packing/packers.h"
#include "packing/plan_cache.h"
#include "runtime/core/fs.h"
#include "runtime/io/token_dataset.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

// ---- helpers ------------------------------------------------------------------------------------

constexpr int64_t kT = 1024;

// Log-normal lengths with median T/8 and sigma 1 (about 2% of documents longer than T), capped at
// 8·T; Box–Muller written out so the data are the same with every standard library.
std::vector<int64_t> lognormal_lengths(size_t n, uint64_t seed, int64_t T = kT) {
  std::mt19937_64 gen(seed);
  auto uniform = [&]() { return (double(gen() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<int64_t> out(n);
  for (auto& len : out) {
    const double z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
    const double l = double(T) / 8.0 * std::exp(z);
    len = std::clamp<int64_t>(int64_t(std::llround(l)), 1, 8 * T);
  }
  return out;
}

PackOptions opts(PackAlgorithm a, int64_t T = kT, uint64_t seed = 0) {
  PackOptions o;
  o.seq_len = T;
  o.algorithm = a;
  o.seed = seed;
  return o;
}

std::vector<int64_t> row_tokens(const PackPlan& plan) {
  std::vector<int64_t> out(size_t(plan.n_rows()), 0);
  for (int64_t r = 0; r < plan.n_rows(); ++r) {
    for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
      out[size_t(r)] += plan.pieces[size_t(k)].length;
    }
  }
  return out;
}

// Every token of every kept document exactly once, in consecutive pieces; dropped = L > T under
// DROP; no row over T, no empty row.
void expect_valid(const PackPlan& plan, const std::vector<int64_t>& lengths) {
  const int64_t T = plan.options.seq_len;
  ASSERT_FALSE(plan.row_offsets.empty());
  EXPECT_EQ(plan.row_offsets.front(), 0);
  EXPECT_EQ(plan.row_offsets.back(), int64_t(plan.pieces.size()));
  for (int64_t r = 0; r < plan.n_rows(); ++r) {
    EXPECT_LT(plan.row_offsets[size_t(r)], plan.row_offsets[size_t(r) + 1]) << "empty row " << r;
  }
  for (const int64_t t : row_tokens(plan)) ASSERT_LE(t, T);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> by_doc(lengths.size());
  for (const Piece& p : plan.pieces) {
    ASSERT_GE(p.doc, 0);
    ASSERT_LT(p.doc, int64_t(lengths.size()));
    ASSERT_GT(p.length, 0);
    by_doc[size_t(p.doc)].push_back({p.start, p.length});
  }
  for (size_t d = 0; d < lengths.size(); ++d) {
    auto& v = by_doc[d];
    const bool dropped = plan.options.long_docs == LongDocs::DROP && lengths[d] > T;
    if (dropped || lengths[d] == 0) {
      ASSERT_TRUE(v.empty()) << "doc " << d;
      continue;
    }
    std::sort(v.begin(), v.end());
    int64_t next = 0;
    for (const auto& [start, len] : v) {
      ASSERT_EQ(start, next) << "doc " << d;
      next += len;
    }
    ASSERT_EQ(next, lengths[d]) << "doc " << d;
  }
  EXPECT_EQ(plan_mismatch(plan, lengths), "");  // the loader's check agrees
}

std::vector<uint64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<uint64_t> off(1, 0);
  for (const int64_t l : lengths) off.push_back(off.back() + uint64_t(l));
  return off;
}

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) EXPECT_NE(text.find(part), std::string::npos) << text;
}

bool same_plan(const PackPlan& a, const PackPlan& b) {
  if (a.row_offsets != b.row_offsets || a.pieces.size() != b.pieces.size()) return false;
  for (size_t i = 0; i < a.pieces.size(); ++i) {
    const Piece &x = a.pieces[i], &y = b.pieces[i];
    if (x.doc != y.doc || x.start != y.start || x.length != y.length) return false;
  }
  return true;
}

const PackAlgorithm kAll[] = {PackAlgorithm::BFD, PackAlgorithm::NEXT_FIT, PackAlgorithm::PADDED,
                              PackAlgorithm::BALANCED};

// ---- algorithms ---------------------------------------------------------------------------------

TEST(Packers, EveryAlgorithmCoversEveryTokenOrDropsExactlyTheLongOnes) {
  std::vector<int64_t> lengths = lognormal_lengths(20000, 1);
  lengths[5] = 0;  // empty documents produce no piece
  lengths[6] = 3 * kT;
  for (const PackAlgorithm a : kAll) {
    for (const LongDocs l : {LongDocs::SPLIT, LongDocs::DROP}) {
      PackOptions o = opts(a);
      o.long_docs = l;
      o.beta = a == PackAlgorithm::BALANCED ? 1.0 / kT : 0.0;
      SCOPED_TRACE(pack_algorithm_name(a) + (l == LongDocs::DROP ? " drop" : " split"));
      const PackPlan plan = pack_documents(lengths, o);
      expect_valid(plan, lengths);
      const PackStats s = pack_stats(plan, lengths);
      const auto n_long = std::count_if(lengths.begin(), lengths.end(),
                                        [](int64_t x) { return x > kT; });
      ASSERT_GT(n_long, 0);
      EXPECT_EQ(s.docs_dropped, l == LongDocs::DROP ? n_long : 0);
      EXPECT_EQ(s.docs_cut, l == LongDocs::SPLIT ? n_long : 0);
    }
  }
}

TEST(Packers, AlignedPiecesTakeWholeMultiplesOfTheirRow) {
  // Context parallelism packs with align = 2·cp: each piece's padded length fits its row, the
  // pieces keep their own lengths, and every token is still covered once.
  const std::vector<int64_t> lengths = lognormal_lengths(5000, 3);
  for (const PackAlgorithm a : kAll) {
    for (int64_t align : {int64_t(4), int64_t(8)}) {
      PackOptions o = opts(a);
      o.align = align;
      SCOPED_TRACE(pack_algorithm_name(a) + " align " + std::to_string(align));
      const PackPlan plan = pack_documents(lengths, o);
      expect_valid(plan, lengths);
      for (int64_t r = 0; r < plan.n_rows(); ++r) {
        int64_t slots = 0;
        for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
          slots += (plan.pieces[size_t(k)].length + align - 1) / align * align;
        }
        ASSERT_LE(slots, kT) << "row " << r;
      }
    }
  }
  PackOptions bad = opts(PackAlgorithm::BFD);
  bad.align = 3;  // does not divide seq_len
  EXPECT_THROW(pack_documents(lengths, bad), Error);
}

TEST(Packers, RejectsBadOptions) {
  expect_error([] { pack_documents({1, 2}, opts(PackAlgorithm::BFD, 0)); }, {"seq_len"});
  PackOptions o = opts(PackAlgorithm::BFD);
  o.window = 0;
  expect_error([&] { pack_documents({1, 2}, o); }, {"window"});
  expect_error([] { parse_pack_algorithm("ffd"); }, {"unknown packing algorithm 'ffd'"});
  for (const PackAlgorithm a : kAll) EXPECT_EQ(parse_pack_algorithm(pack_algorithm_name(a)), a);
}

TEST(Packers, PaddedHasOnePiecePerRowAndNextFitKeepsTheSeededOrder) {
  const std::vector<int64_t> lengths = lognormal_lengths(5000, 2);
  const PackPlan padded = pack_documents(lengths, opts(PackAlgorithm::PADDED, kT, 9));
  for (int64_t r = 0; r < padded.n_rows(); ++r) {
    ASSERT_EQ(padded.row_offsets[size_t(r) + 1] - padded.row_offsets[size_t(r)], 1);
  }
  // Padded lists the pieces in the seeded order; next-fit must keep exactly that order and close a
  // row only when the next piece does not fit.
  const PackPlan nf = pack_documents(lengths, opts(PackAlgorithm::NEXT_FIT, kT, 9));
  ASSERT_EQ(nf.pieces.size(), padded.pieces.size());
  for (size_t i = 0; i < nf.pieces.size(); ++i) {
    ASSERT_EQ(nf.pieces[i].doc, padded.pieces[i].doc);
    ASSERT_EQ(nf.pieces[i].start, padded.pieces[i].start);
  }
  const std::vector<int64_t> used = row_tokens(nf);
  for (int64_t r = 0; r + 1 < nf.n_rows(); ++r) {
    const Piece& first_next = nf.pieces[size_t(nf.row_offsets[size_t(r) + 1])];
    EXPECT_GT(used[size_t(r)] + first_next.length, kT) << "row " << r << " closed too early";
  }
  // The seeded order is a permutation, not the identity.
  bool shuffled = false;
  for (size_t i = 1; i < padded.pieces.size(); ++i) shuffled |= padded.pieces[i].doc < padded.pieces[i - 1].doc;
  EXPECT_TRUE(shuffled);
}

TEST(Packers, BfdFindsTheOptimalRowsOfASmallExample) {
  // 30 tokens into rows of 10: sorted 7,6,5,5,4,3 -> {7,3} {6,4} {5,5}, three full rows.
  const std::vector<int64_t> lengths = {6, 4, 5, 5, 3, 7};
  const PackPlan plan = pack_documents(lengths, opts(PackAlgorithm::BFD, 10));
  ASSERT_EQ(plan.n_rows(), 3);
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < 3; ++r) {
    rows.emplace_back();
    for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
      rows.back().push_back(plan.pieces[size_t(k)].length);
    }
  }
  EXPECT_EQ(rows, (std::vector<std::vector<int64_t>>{{7, 3}, {6, 4}, {5, 5}}));
  EXPECT_DOUBLE_EQ(pack_stats(plan, lengths).efficiency, 1.0);
}

TEST(Packers, BfdBeatsNextFitBeatsPaddedOnLogNormalLengths) {
  const std::vector<int64_t> lengths = lognormal_lengths(200000, 3);
  std::map<PackAlgorithm, PackStats> s;
  for (const PackAlgorithm a : {PackAlgorithm::BFD, PackAlgorithm::NEXT_FIT, PackAlgorithm::PADDED}) {
    s[a] = pack_stats(pack_documents(lengths, opts(a)), lengths);
    std::printf("%-9s %s\n", pack_algorithm_name(a).c_str(), format_pack_stats(s[a], 0).c_str());
  }
  EXPECT_GT(s[PackAlgorithm::BFD].efficiency, s[PackAlgorithm::NEXT_FIT].efficiency);
  EXPECT_GT(s[PackAlgorithm::NEXT_FIT].efficiency, s[PackAlgorithm::PADDED].efficiency);
  EXPECT_LE(s[PackAlgorithm::BFD].padding_waste, 0.03);
}

TEST(Packers, SameSeedSamePlanOtherSeedOtherPlan) {
  const std::vector<int64_t> lengths = lognormal_lengths(10000, 4);
  for (const PackAlgorithm a : kAll) {
    const PackPlan p1 = pack_documents(lengths, opts(a, kT, 7));
    const PackPlan p2 = pack_documents(lengths, opts(a, kT, 7));
    const PackPlan p3 = pack_documents(lengths, opts(a, kT, 8));
    EXPECT_TRUE(same_plan(p1, p2)) << pack_algorithm_name(a);
    EXPECT_FALSE(same_plan(p1, p3)) << pack_algorithm_name(a);
  }
}

TEST(Packers, WindowOfOneIsValidAndClosesEveryRow) {
  // Rows close at the end of each window, so a window of one piece gives one piece per row.
  const std::vector<int64_t> lengths = lognormal_lengths(3000, 5);
  PackOptions o = opts(PackAlgorithm::BFD);
  o.window = 1;
  const PackPlan plan = pack_documents(lengths, o);
  expect_valid(plan, lengths);
  EXPECT_TRUE(same_plan(plan, pack_documents(lengths, opts(PackAlgorithm::PADDED))));
  o.window = 2;
  const PackPlan two = pack_documents(lengths, o);
  expect_valid(two, lengths);
  EXPECT_LT(two.n_rows(), plan.n_rows());
}

TEST(Packers, BalancedEvensOutRowCost) {
  // Mixed: many short documents and a share of long ones; cost α·L + β·L² with β = 1/T so the
  // attention term of a full row equals its linear term.
  std::vector<int64_t> lengths = lognormal_lengths(20000, 6);
  const double alpha = 1.0, beta = 1.0 / double(kT);
  auto spread = [&](const PackPlan& plan) {  // coefficient of variation of the row costs
    std::vector<double> cost(size_t(plan.n_rows()), 0.0);
    for (int64_t r = 0; r < plan.n_rows(); ++r) {
      for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
        const double l = double(plan.pieces[size_t(k)].length);
        cost[size_t(r)] += alpha * l + beta * l * l;
      }
    }
    double mean = 0, var = 0;
    for (const double c : cost) mean += c;
    mean /= double(cost.size());
    for (const double c : cost) var += (c - mean) * (c - mean);
    return std::sqrt(var / double(cost.size())) / mean;
  };
  PackOptions o = opts(PackAlgorithm::BALANCED);
  o.alpha = alpha;
  o.beta = beta;
  const PackPlan balanced = pack_documents(lengths, o);
  const PackPlan bfd = pack_documents(lengths, opts(PackAlgorithm::BFD));
  expect_valid(balanced, lengths);
  const double sb = spread(balanced), sf = spread(bfd);
  std::printf("row cost spread (std/mean): balanced %.4f, bfd %.4f\n", sb, sf);
  // Measured: balanced 0.2073, bfd 0.2086. The gain is small because the cost capacity c(T) never
  // binds (cost is superadditive, so T tokens always fit in it); only the choice among fitting
  // rows differs. Same rows count within 1%: balancing must not cost packing efficiency.
  EXPECT_LT(sb, sf);
  EXPECT_LE(double(balanced.n_rows()), 1.01 * double(bfd.n_rows()));
}

// Scale check (correctness at 1 M documents). Speed is a benchmark figure (bench_packing), not a
// timed assertion: sanitizer and Debug builds run this too.
TEST(Packers, OneMillionDocumentsPackCompletely) {
  const std::vector<int64_t> lengths = lognormal_lengths(1000000, 7);
  const auto t0 = std::chrono::steady_clock::now();
  const PackPlan plan = pack_documents(lengths, opts(PackAlgorithm::BFD));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("BFD, 1,000,000 documents: %.3f s, %lld rows\n", s, (long long)plan.n_rows());
  int64_t want = 0, got = 0;
  for (int64_t L : lengths) want += L;
  for (const Piece& p : plan.pieces) got += p.length;
  EXPECT_EQ(got, want) << "every token packed exactly once";
  EXPECT_GT(plan.n_rows(), 0);
}

// ---- plan files ---------------------------------------------------------------------------------

class PlanFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / fmt::format("berth_pack_{}_{}", info->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(PlanFileTest, RoundTrip) {
  const std::vector<int64_t> lengths = lognormal_lengths(2000, 8);
  PackOptions o = opts(PackAlgorithm::BALANCED, 512, 0xfedcba9876543210ull);
  o.window = 77;
  o.long_docs = LongDocs::DROP;
  o.beta = 0.25;
  o.align = 8;
  const PackPlan plan = pack_documents(lengths, o);
  const std::string key = plan_key(offsets_of(lengths), o);
  EXPECT_EQ(key.size(), 16u);
  write_plan(path("p.h5"), plan, key);
  std::string read_key;
  const PackPlan back = read_plan(path("p.h5"), &read_key);
  EXPECT_EQ(read_key, key);
  EXPECT_TRUE(same_plan(plan, back));
  EXPECT_EQ(back.options.seq_len, 512);
  EXPECT_EQ(back.options.algorithm, PackAlgorithm::BALANCED);
  EXPECT_EQ(back.options.window, 77);
  EXPECT_EQ(back.options.seed, 0xfedcba9876543210ull);
  EXPECT_EQ(back.options.long_docs, LongDocs::DROP);
  EXPECT_EQ(back.options.beta, 0.25);
  EXPECT_EQ(back.options.align, 8);
  EXPECT_EQ(plan_key(offsets_of(lengths), back.options), key);
}

TEST_F(PlanFileTest, KeyChangesWithDataAndEveryOption) {
  const std::vector<uint64_t> off = {0, 5, 9, 20};
  const PackOptions o = opts(PackAlgorithm::BFD);
  const std::string k = plan_key(off, o);
  EXPECT_EQ(k, plan_key(off, o));
  EXPECT_NE(k, plan_key({0, 5, 10, 20}, o));
  std::vector<PackOptions> variants(8, o);
  variants[0].seq_len = 2048;
  variants[1].algorithm = PackAlgorithm::NEXT_FIT;
  variants[2].window = 999;
  variants[3].long_docs = LongDocs::DROP;
  variants[4].seed = 1;
  variants[5].alpha = 2.0;
  variants[6].beta = 0.5;
  variants[7].align = 4;
  for (const PackOptions& v : variants) EXPECT_NE(k, plan_key(off, v));
}

TEST_F(PlanFileTest, StaleKeyRebuildsMatchingKeyReuses) {
  const std::vector<int64_t> lengths = lognormal_lengths(3000, 9);
  const std::vector<uint64_t> off = offsets_of(lengths);
  const std::string p = path("data.h5.plan-bfd-T128.h5");  // the default name of a cache
  bool reused = true;
  const PackPlan first = load_or_build_plan(p, off, opts(PackAlgorithm::BFD), &reused);
  EXPECT_FALSE(reused);  // absent
  ASSERT_TRUE(fs::exists(p));
  const PackPlan again = load_or_build_plan(p, off, opts(PackAlgorithm::BFD), &reused);
  EXPECT_TRUE(reused);
  EXPECT_TRUE(same_plan(first, again));
  // Other options: the key differs, the plan is rebuilt and the file replaced.
  const PackPlan other = load_or_build_plan(p, off, opts(PackAlgorithm::BFD, kT, 3), &reused);
  EXPECT_FALSE(reused);
  std::string key;
  read_plan(p, &key);
  EXPECT_EQ(key, plan_key(off, opts(PackAlgorithm::BFD, kT, 3)));
  // Other data (one document longer): rebuilt as well.
  std::vector<uint64_t> off2 = off;
  for (size_t i = 5; i < off2.size(); ++i) off2[i] += 1;
  load_or_build_plan(p, off2, opts(PackAlgorithm::BFD, kT, 3), &reused);
  EXPECT_FALSE(reused);
  // A corrupt cache (under a plan's default name) is rebuilt rather than fatal.
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "garbage";
  load_or_build_plan(p, off2, opts(PackAlgorithm::BFD, kT, 3), &reused);
  EXPECT_FALSE(reused);
  load_or_build_plan(p, off2, opts(PackAlgorithm::BFD, kT, 3), &reused);
  EXPECT_TRUE(reused);
}

TEST(Packers, PlanMismatchNamesEachKindOfDamage) {
  const std::vector<int64_t> lengths = {100, 0, 300, 50, 20};  // T = 128: doc 2 is cut in three
  PackOptions o = opts(PackAlgorithm::BFD, 128);
  const PackPlan good = pack_documents(lengths, o);
  ASSERT_EQ(plan_mismatch(good, lengths), "");
  auto damaged = [&](auto&& edit) {
    PackPlan p = good;
    edit(p);
    return plan_mismatch(p, lengths);
  };
  auto piece_of = [](PackPlan& p, int64_t doc, int64_t start) -> Piece& {
    for (Piece& x : p.pieces)
      if (x.doc == doc && x.start == start) return x;
    throw std::runtime_error("no such piece");
  };
  expect_contains(
      damaged([&](PackPlan& p) { piece_of(p, 3, 0).start = 10; }),
      {"piece", "(50 tokens from token 10 of document 3) is not inside the document's 50 tokens"});
  expect_contains(damaged([&](PackPlan& p) { piece_of(p, 0, 0).doc = 9; }),
                  {"names document 9, the dataset has 5"});
  expect_contains(damaged([&](PackPlan& p) { piece_of(p, 2, 128).start = 100; }),
                  {"document 2: two pieces hold token 100"});
  expect_contains(damaged([&](PackPlan& p) { piece_of(p, 2, 0).length = 100; }),
                  {"document 2: no piece holds tokens 100..128"});
  expect_contains(damaged([&](PackPlan& p) {  // the first rows only, as a truncated file
                    p.row_offsets.resize(2);
                    p.pieces.resize(size_t(p.row_offsets.back()));
                  }),
                  {"of its", "tokens in the plan"});
  expect_contains(damaged([&](PackPlan& p) {  // every piece in one row
                    p.row_offsets = {0, int64_t(p.pieces.size())};
                  }),
                  {"row 0 holds", "more than seq_len 128"});
  // Dropped long documents are no damage under DROP, and are under SPLIT.
  o.long_docs = LongDocs::DROP;
  const PackPlan dropped = pack_documents(lengths, o);
  EXPECT_EQ(plan_mismatch(dropped, lengths), "");
  PackPlan claimed_split = dropped;
  claimed_split.options.long_docs = LongDocs::SPLIT;
  EXPECT_EQ(plan_mismatch(claimed_split, lengths),
            "document 2 has 0 of its 300 tokens in the plan");
}

TEST_F(PlanFileTest, ADamagedPlanWithTheRightKeyIsRebuilt) {
  const std::vector<int64_t> lengths = lognormal_lengths(500, 4);
  const std::vector<uint64_t> off = offsets_of(lengths);
  const PackOptions o = opts(PackAlgorithm::BFD, 128);
  const std::string p = path("data.h5.plan-bfd-T128.h5");
  bool reused = true;
  const PackPlan first = load_or_build_plan(p, off, o, &reused);
  PackPlan cut = first;  // its first 10 rows: it trained on 2 % of the data, without a word
  cut.row_offsets.resize(11);
  cut.pieces.resize(size_t(cut.row_offsets.back()));
  write_plan(p, cut, plan_key(off, o));
  const PackPlan again = load_or_build_plan(p, off, o, &reused);
  EXPECT_FALSE(reused);
  EXPECT_TRUE(same_plan(first, again));
  load_or_build_plan(p, off, o, &reused);
  EXPECT_TRUE(reused);
}

TEST_F(PlanFileTest, SpecificErrors) {
  expect_error([&] { read_plan(path("missing.h5"), nullptr); }, {"does not exist", "berth pack"});
  std::ofstream(path("junk.h5"), std::ios::binary) << "this is not an HDF5 file at all";
  expect_error([&] { read_plan(path("junk.h5"), nullptr); },
               {"not a readable HDF5 file", "junk.h5"});
  // Truncated: a real plan cut in half.
  const std::vector<int64_t> lengths = lognormal_lengths(5000, 10);
  const PackPlan plan = pack_documents(lengths, opts(PackAlgorithm::BFD));
  write_plan(path("cut.h5"), plan, "k");
  fs::resize_file(path("cut.h5"), fs::file_size(path("cut.h5")) / 2);
  expect_error([&] { read_plan(path("cut.h5"), nullptr); }, {"corrupt or truncated", "cut.h5"});
  // Another berth format: a token dataset is not a plan.
  TokenDataset ds;
  ds.tokens = {1, 2, 3};
  ds.doc_offsets = {0, 3};
  ds.vocab_size = 10;
  write_token_dataset(path("tokens.h5"), ds);
  expect_error([&] { read_plan(path("tokens.h5"), nullptr); },
               {"has format 'berth-tokens', expected 'berth-pack-plan'"});
}

TEST_F(PlanFileTest, OnlyAPlanIsEverReplaced) {
  const std::vector<int64_t> lengths = lognormal_lengths(500, 12);
  const std::vector<uint64_t> off = offsets_of(lengths);
  const PackPlan plan = pack_documents(lengths, opts(PackAlgorithm::BFD));
  // The token dataset itself named as the plan (data.pack_plan = data.train, or berth pack --out
  // D.h5 --data D.h5): refused, and the dataset is unchanged.
  TokenDataset ds;
  ds.tokens = {1, 2, 3};
  ds.doc_offsets = {0, 3};
  ds.vocab_size = 10;
  write_token_dataset(path("tokens.h5"), ds);
  const auto tokens_size = fs::file_size(path("tokens.h5"));
  bool reused = true;
  expect_error(
      [&] { load_or_build_plan(path("tokens.h5"), off, opts(PackAlgorithm::BFD), &reused); },
      {"refusing to write a packing plan to", "'berth-tokens' file", "data.pack_plan"});
  expect_error([&] { write_plan(path("tokens.h5"), plan, "k"); }, {"'berth-tokens' file"});
  EXPECT_EQ(read_token_dataset(path("tokens.h5")).tokens, ds.tokens);
  EXPECT_EQ(fs::file_size(path("tokens.h5")), tokens_size);
  // Any other file: a text file, a directory.
  std::ofstream(path("notes.txt")) << "my notes\n";
  expect_error([&] { write_plan(path("notes.txt"), plan, "k"); }, {"not an HDF5 file"});
  EXPECT_EQ(read_text_file(path("notes.txt")), "my notes\n");
  fs::create_directories(path("adir"));
  expect_error([&] { require_plan_destination(path("adir")); }, {"is a directory"});
  // A plan, of other options or cut short, is berth's own: replaced.
  write_plan(path("p.h5"), plan, "old-key");
  load_or_build_plan(path("p.h5"), off, opts(PackAlgorithm::BFD), &reused);
  EXPECT_FALSE(reused);
  write_plan(path("p.h5"), plan, "old-key");
  EXPECT_NO_THROW(require_plan_destination(path("p.h5")));
  EXPECT_NO_THROW(require_plan_destination(path("absent.h5")));
}

// The command a refused data.pack_plan message gives is pasted into a shell: paths with spaces or
// quotes are quoted, plain ones left as they are.
TEST(PackCommand, QuotesPathsAShellWouldSplit) {
  PackOptions o;
  o.seq_len = 1024;
  o.align = 4;
  EXPECT_EQ(pack_command("data/train.h5", o, "plan.h5"),
            "berth pack --data data/train.h5 --seq-len 1024 --algorithm bfd --window 1000 --seed 0 "
            "--align 4 --out plan.h5");
  EXPECT_EQ(pack_command("my data/train.h5", o, "it's.h5"),
            "berth pack --data 'my data/train.h5' --seq-len 1024 --algorithm bfd --window 1000 "
            "--seed 0 --align 4 --out 'it'\\''s.h5'");
}

}  // namespace
}  // namespace berth
