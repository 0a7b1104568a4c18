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

GridShape resolve_grid(const GridRequest& r, int world, int64_t n_head, int64_t n_layer) {
  BERTH_CHECK(r.tp >= 1 && r.pp >= 1 && r.cp >= 1 && r.dp >= 0,
              "parallel sizes must be >= 1 (dp may be 0 = derived): tp={} pp={} cp={} dp={}", r.tp,
              r.pp, r.cp, r.dp);
  // Factor by factor, so no product can wrap (tp=pp=2^30 with cp=32 made tp·pp·cp 0, and then a
  // division by it): every factor is first at most the world (< 2^31), so each product is of two
  // numbers below 2^31.
  BERTH_CHECK(r.tp <= world && r.pp <= world && r.cp <= world && r.tp * r.pp <= world &&
                  r.tp * r.pp * r.cp <= world,
              "tp·pp·cp = {}·{}·{} is more than the {} launched ranks: launch tp·pp·cp·dp ranks "
              "or lower parallel.tp/pp/cp",
              r.tp, r.pp, r.cp, world);
  BERTH_CHECK(r.dp <= world,
              "parallel.dp = {} is more than the {} launched ranks: set parallel.dp = 0 to derive "
              "it from the ranks, or launch tp·pp·cp·dp ranks",
              r.dp, world);
  const int64_t inner = r.tp * r.pp * r.cp;
  int64_t dp = r.dp;
  if (dp == 0) {
    BERTH_CHECK(world % inner == 0,
                "the {} ranks cannot be split into groups of tp·pp·cp = {}·{}·{} = {}: launch a "
                "multiple of {} ranks or change parallel.tp/pp/cp",
                world, r.tp, r.pp, r.cp, inner, inner);
    dp = world / inner;
  }
  BERTH_CHECK(inner * dp == world,
              "tp·pp·cp·dp = {}·{}·{}·{} = {} does not match the {} launched ranks: {}", r.tp, r.pp,
              r.cp, dp, inner * dp, world,
              world % inner == 0
                  ? fmt::format("set parallel.dp = {} (or 0 to derive it) or launch {} rank{}",
                                world / inner, inner * dp, inner * dp == 1 ? "" : "s")
                  : fmt::format("launch {} rank{} (the {} launched do not split into groups of "
                                "tp·pp·cp = {}), or change parallel.tp/pp/cp",
                                inner * dp, inner * dp == 1 ? "" : "s", world, inner));
  BERTH_CHECK(n_head % r.tp == 0, "model.n_head ({}) must be divisible by parallel.tp ({})", n_head,
              r.tp);
  BERTH_CHECK(r.pp <= n_layer, "parallel.pp ({}) > model.n_layer ({}): a stage needs a layer",
              r.pp, n_layer);
  return GridShape{int(r.tp), int(r.cp), int(r.pp), int(dp)};
}

std::string describe_grid(const GridShape& s) {
  return fmt::format("dp={} tp={} pp={} cp={} ({} rank{})", s.dp, s.tp, s.pp, s.cp, s.world(),
                     s.world() == 1 ? "" : "s");
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape)
    : world_(world), shape_(shape) {
  BERTH_CHECK(world.size() == shape.world(), "grid {} needs {} ranks, the world has {}",
              describe_grid(shape), shape.world(), world.size());
  coord_ = grid_coord(shape, world.rank());
  const GridCoord c = coord_;
  auto color = [&](GridCoord g) { return grid_rank(shape, g); };  // rank of the group's first member
  tp_ = world.split(color({0, c.cp, c.pp, c.dp}), c.tp);
  cp_ = world.split(color({c.tp, 0, c.pp, c.dp}), c.cp);
  pp_ = world.split(color({c.tp, c.cp, 0, c.dp}), c.pp);
  dp_ = world.split(color({c.tp, c.cp, c.pp, 0}), c.dp);
  dp_cp_ = world.split(color({c.tp, 0, c.pp, 0}), c.dp * shape.cp + c.cp);
  const bool ends = shape.pp > 1 && (c.pp == 0 || c.pp == shape.pp - 1);
  embed_ = world.split(ends ? color({c.tp, c.cp, 0, c.dp}) : shape.world() + world.rank(), c.pp);
}

double ProcessGrid::comm_seconds() const {
  double s = world_.stats().seconds;
  for (const auto* g : {&tp_, &cp_, &pp_, &dp_, &dp_cp_, &embed_}) s += (*g)->stats().seconds;
  return s;
}

}  // namespace berth
