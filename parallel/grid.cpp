#include "parallel/grid.h"

#include "runtime/core/check.h"

namespace berth {

GridCoord grid_coord(const GridShape& s, int rank) {
  BERTH_CHECK(s.tp > 0 && s.cp > 0 && s.pp > 0 && s.dp > 0,
              "grid sizes must be positive: tp={} cp={} pp={} dp={}", s.tp, s.cp, s.pp, s.dp);
  BERTH_CHECK(rank >= 0 && rank < s.world(), "rank {} outside the grid of {} ranks", rank,
              s.world());
  GridCoord c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.cp = rank % s.cp;
  rank /= s.cp;
  c.pp = rank % s.pp;
  c.dp = rank / s.pp;
  return c;
}

int grid_rank(const GridShape& s, const GridCoord& c) {
  BERTH_CHECK(c.tp >= 0 && c.tp < s.tp && c.cp >= 0 && c.cp < s.cp && c.pp >= 0 && c.pp < s.pp &&
                  c.dp >= 0 && c.dp < s.dp,
              "coordinate (tp {}, cp {}, pp {}, dp {}) outside the grid tp={} cp={} pp={} dp={}",
              c.tp, c.cp, c.pp, c.dp, s.tp, s.cp, s.pp, s.dp);
  return ((c.dp * s.pp + c.pp) * s.cp + c.cp) * s.tp + c.tp;
}

}  // namespace berth
