#include "jumbo/comm/grid.h"

#include <fmt/format.h>

#include "jumbo/config/config.h"

namespace jumbo {

GridCoords grid_coords(int rank, int tp, int dp) {
  return {rank % tp, (rank / tp) % dp, rank / (tp * dp)};
}

Grid::Grid(std::shared_ptr<Comm> world, int tp, int pp) : world_(std::move(world)) {
  const int n = world_->size();
  if (tp < 1 || pp < 1 || n % (tp * pp) != 0) {
    throw UserError(fmt::format("world size {} is not a multiple of parallel.tp x parallel.pp = "
                                "{} x {}",
                                n, tp, pp));
  }
  tp_size_ = tp;
  pp_size_ = pp;
  dp_size_ = n / (tp * pp);
  const GridCoords at = grid_coords(world_->rank(), tp, dp_size_);
  tp_rank_ = at.tp_rank;
  dp_rank_ = at.dp_rank;
  pp_rank_ = at.pp_rank;
  // Colours name the coordinates the members share; keys order them by the varying one.
  tp_ = world_->split(pp_rank_ * dp_size_ + dp_rank_, tp_rank_, "tp");
  dp_ = world_->split(pp_rank_ * tp_size_ + tp_rank_, dp_rank_, "dp");
  pp_ = world_->split(dp_rank_ * tp_size_ + tp_rank_, pp_rank_, "pp");
  mp_ = world_->split(dp_rank_, pp_rank_ * tp_size_ + tp_rank_, "model-parallel");
  const bool ends = first_stage() || last_stage();
  embedding_ = world_->split(ends ? dp_rank_ * tp_size_ + tp_rank_ : -1, pp_rank_, "embedding");
  if (!embedding_) embedding_ = make_solo_comm("embedding");  // a middle stage
}

}  // namespace jumbo
