#include "jumbo/parallel/rank_stage.h"

namespace jumbo {

RankStage::RankStage(std::shared_ptr<Comm> world, const ModelConfig& model, const Layout& layout,
                     const StepShape& shape)
    : grid_(std::make_unique<Grid>(std::move(world), static_cast<int>(layout.tp),
                                   static_cast<int>(layout.pp))),
      groups_(process_groups(*grid_)),
      plan_(plan_stage(model, layout, shape, grid_->coords())) {}

RankStage::RankStage(std::shared_ptr<Comm> world, const RunConfig& cfg)
    : RankStage(std::move(world), cfg.model, cfg.parallel, step_shape_of(cfg)) {}

RankStage solo_rank_stage(const ModelConfig& model, const Layout& layout, const StepShape& shape) {
  return RankStage(make_solo_comm("world"), model, layout, shape);
}

}  // namespace jumbo
