// Grid coordinates: a bijection between ranks and (tp, cp, pp, dp), TP innermost then CP, PP, DP.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "parallel/grid.h"
#include "runtime/core/check.h"

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
