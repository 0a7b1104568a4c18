// Pure index arithmetic of parallel/: grid coordinates (a bijection between ranks and
// (tp, cp, pp, dp), TP innermost then CP, PP, DP), layout resolution and ZeRO shard ranges.
#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/grid.h"
#include "runtime/core/check.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

TEST(Grid, RankOrderIsTpInnermostThenCpPpDp) {
  const GridShape s{2, 3, 2, 2};  // tp, cp, pp, dp
  EXPECT_EQ(grid_coord(s, 1), (GridCoord{1, 0, 0, 0}));
  EXPECT_EQ(grid_coord(s, 2), (GridCoord{0, 1, 0, 0}));
  EXPECT_EQ(grid_coord(s, 6), (GridCoord{0, 0, 1, 0}));
  EXPECT_EQ(grid_coord(s, 12), (GridCoord{0, 0, 0, 1}));
  EXPECT_EQ(grid_coord(s, 23), (GridCoord{1, 2, 1, 1}));
}

TEST(Grid, CoordAndRankAreInversesForManyShapes) {
  for (int tp : {1, 2, 4})
    for (int cp : {1, 3})
      for (int pp : {1, 2, 5})
        for (int dp : {1, 2, 3}) {
          const GridShape s{tp, cp, pp, dp};
          std::set<std::tuple<int, int, int, int>> seen;
          for (int r = 0; r < s.world(); r++) {
            const GridCoord c = grid_coord(s, r);
            EXPECT_EQ(grid_rank(s, c), r);
            seen.insert({c.tp, c.cp, c.pp, c.dp});
          }
          EXPECT_EQ(int(seen.size()), s.world());
        }
}

TEST(Grid, OutOfRangeIsAnError) {
  const GridShape s{2, 1, 1, 2};
  EXPECT_THROW(grid_coord(s, 4), Error);
  EXPECT_THROW(grid_coord(s, -1), Error);
  EXPECT_THROW(grid_rank(s, GridCoord{2, 0, 0, 0}), Error);
  EXPECT_THROW(grid_coord(GridShape{0, 1, 1, 1}, 0), Error);
}

}  // namespace
}  // namespace berth

namespace berth {
namespace {

TEST(ResolveGrid, DerivesDpAndChecksTheLayout) {
  EXPECT_EQ(resolve_grid(GridRequest{}, 4, 4, 2).dp, 4);
  EXPECT_EQ(resolve_grid(GridRequest{1, 1, 1, 2}, 2, 4, 2).dp, 2);
  test::expect_error([] { resolve_grid(GridRequest{1, 1, 1, 3}, 4, 4, 2); },
                     {"tp·pp·cp·dp = 1·1·1·3 = 3 does not match the 4 launched ranks",
                      "parallel.dp = 4"});
  test::expect_error([] { resolve_grid(GridRequest{5, 1, 1, 0}, 5, 12, 2); },
                     {"model.n_head (12) must be divisible by parallel.tp (5)"});
  test::expect_error([] { resolve_grid(GridRequest{1, 6, 1, 0}, 6, 4, 4); },
                     {"parallel.pp (6) > model.n_layer (4)"});
  test::expect_error([] { resolve_grid(GridRequest{2, 1, 1, 0}, 3, 4, 2); },
                     {"cannot be split into groups of tp·pp·cp"});
  const GridShape tp_pp = resolve_grid(GridRequest{2, 2, 1, 0}, 8, 4, 2);  // tp 2 × pp 2 × dp 2
  EXPECT_EQ(tp_pp.tp, 2);
  EXPECT_EQ(tp_pp.pp, 2);
  EXPECT_EQ(tp_pp.dp, 2);
  const GridShape cp = resolve_grid(GridRequest{1, 1, 2, 0}, 4, 4, 2);  // cp 2 × dp 2
  EXPECT_EQ(cp.cp, 2);
  EXPECT_EQ(cp.dp, 2);
  test::expect_error([] { resolve_grid(GridRequest{0, 1, 1, 0}, 4, 4, 2); }, {"must be >= 1"});
}

// Sizes whose product wraps int64 (2^30·2^30·32 = 2^65 wrapped to 0, and the world was divided by
// it) are refused by their factors, before any product is formed.
TEST(ResolveGrid, RefusesSizesBeyondTheRanksWithoutFormingTheirProduct) {
  constexpr int64_t k2p30 = int64_t(1) << 30, kMax32 = 2147483647;
  for (const GridRequest& r : {GridRequest{k2p30, k2p30, 32, 0}, GridRequest{kMax32, kMax32, 4, 0},
                               GridRequest{1, 1, 3, 0}, GridRequest{2, 1, k2p30, 1}}) {
    test::expect_error(
        [&] { resolve_grid(r, 2, 4, 2); },
        {fmt::format("tp·pp·cp = {}·{}·{} is more than the 2 launched ranks", r.tp, r.pp, r.cp)});
  }
  test::expect_error(
      [] {
        resolve_grid(GridRequest{1, 1, 1, int64_t(1) << 40}, 2, 4, 2);
      },
      {"parallel.dp = 1099511627776 is more than the 2 launched ranks"});
}

// With dp set and the ranks not a multiple of tp·pp·cp no dp fits: the advice is the ranks to
// launch, not a dp ("set parallel.dp = 0 (or 0 to derive it)" before).
TEST(ResolveGrid, AdvisesTheRanksToLaunchWhenNoDpFits) {
  try {
    resolve_grid(GridRequest{1, 2, 1, 1}, 3, 4, 2);
    ADD_FAILURE() << "pp 2 × dp 1 on 3 ranks was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("launch 2 ranks (the 3 launched do not split into groups of tp·pp·cp = 2)"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find("set parallel.dp"), std::string::npos) << what;
  }
}

TEST(Shards, CountsAndRangesCoverEveryElementOnce) {
  for (int64_t n : {0, 1, 7, 30080, 30081}) {
    for (int parts : {1, 2, 3, 4, 7}) {
      const std::vector<size_t> counts = shard_counts(n, parts);
      int64_t next = 0;
      for (int i = 0; i < parts; i++) {
        const ShardRange r = shard_range(n, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_EQ(r.size(), int64_t(counts[size_t(i)]));
        EXPECT_LE(r.size(), n / parts + 1);
        EXPECT_GE(r.size(), n / parts);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_EQ(shard_counts(7, 3), (std::vector<size_t>{3, 2, 2}));  // uneven: first ranks get more
  EXPECT_THROW(shard_range(7, 3, 3), Error);
}

}  // namespace
}  // namespace berth
