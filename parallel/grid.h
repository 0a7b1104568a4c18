// The process grid's index arithmetic (pure; no MPI). Ranks are ordered TP innermost, then CP, PP,
// DP:  rank = ((dp·PP + pp)·CP + cp)·TP + tp,  so tensor-parallel peers are neighbours (same node)
// and data-parallel replicas are farthest apart. The MPI issue builds ProcessGrid (sub-communicators
// by split) on these functions.
#pragma once

namespace berth {

struct GridShape {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int world() const { return tp * cp * pp * dp; }
};

struct GridCoord {
  int tp = 0, cp = 0, pp = 0, dp = 0;
  bool operator==(const GridCoord&) const = default;
};

// Coordinates of `rank` (0 <= rank < shape.world(); throws Error otherwise).
GridCoord grid_coord(const GridShape& shape, int rank);
// Inverse of grid_coord (throws Error for a coordinate outside the shape).
int grid_rank(const GridShape& shape, const GridCoord& coord);

}  // namespace berth
