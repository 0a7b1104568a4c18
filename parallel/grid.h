// The process grid's index arithmetic (pure; no MPI). Ranks are ordered TP innermost, then CP, PP,
// DP:  rank = ((dp·PP + pp)·CP + cp)·TP + tp,  so tensor-parallel peers are neighbours (same node)
// and data-parallel replicas are farthest apart. The MPI issue builds ProcessGrid (sub-communicators
// by split) on these functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/communicator.h"

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

// The requested layout (config [parallel]) before it is checked against the world and the model.
struct GridRequest {
  int64_t tp = 1, pp = 1, cp = 1;
  int64_t dp = 0;  // 0 = world / (tp·pp·cp)
};

// Resolves dp and checks the layout before anything is allocated; throws Error with a message a
// user can act on: "tp·pp·cp·dp = 1·1·1·3 = 3 does not match the 4 ranks ...", "n_head (12)
// must be divisible by tp (5)", "pp (6) > n_layer (4)", world not divisible by tp·pp·cp.
GridShape resolve_grid(const GridRequest& req, int world, int64_t n_head, int64_t n_layer);

// "dp=2 tp=1 pp=1 cp=1 (4 ranks)"
std::string describe_grid(const GridShape& shape);

// This rank's place in the grid and its sub-communicators, all made by split() of the world:
// tp() holds the ranks that differ only in tp, and so on; dp_cp() differs in dp and cp (the
// gradient-reduction group). Collective: every rank of `world` constructs it together.
class ProcessGrid {
 public:
  ProcessGrid(Communicator& world, const GridShape& shape);

  const GridShape& shape() const { return shape_; }
  const GridCoord& coord() const { return coord_; }
  Communicator& world() { return world_; }
  Communicator& tp() { return *tp_; }
  Communicator& cp() { return *cp_; }
  Communicator& pp() { return *pp_; }
  Communicator& dp() { return *dp_; }
  Communicator& dp_cp() { return *dp_cp_; }
  // The first and the last pipeline stage of the same (tp, cp, dp) coordinate: the two holders of
  // the tied token embedding / LM head, whose gradients are summed each step. A group of this rank
  // alone on middle stages and when pp = 1.
  Communicator& embed() { return *embed_; }
  // Seconds spent in calls of world and every sub-group (CommStats::seconds summed).
  double comm_seconds() const;

 private:
  Communicator& world_;
  GridShape shape_;
  GridCoord coord_;
  std::unique_ptr<Communicator> tp_, cp_, pp_, dp_, dp_cp_, embed_;
};

}  // namespace berth
