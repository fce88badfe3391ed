#pragma once
// RankStage: where one rank sits in a layout and what its stage holds — the grid of its world,
// the process groups over it, and its stage plan (layers, StageOptions, schedule, slots, ranges).
// The first half of every rank's assembly: training (TrainStage) builds its model stage, grad
// sync, AdamW and pipeline on it; evaluation its forward-only model and runner; generation
// its decoder. One home, so the three cannot drift apart.
#include <memory>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"
#include "jumbo/parallel/groups.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

class RankStage {
 public:
  // `layout` valid for `model` (validate_layout) with its dp set for `world`. Collective over
  // the world (the grid splits its communicators); throws UserError when the world is not a
  // multiple of tp x pp.
  RankStage(std::shared_ptr<Comm> world, const ModelConfig& model, const Layout& layout,
            const StepShape& shape);
  // A run config validated for its world (validated_for_world): its layout and step shape.
  RankStage(std::shared_ptr<Comm> world, const RunConfig& cfg);

  Grid& grid() { return *grid_; }
  const Grid& grid() const { return *grid_; }
  const ProcessGroups& groups() const { return groups_; }
  const StagePlan& plan() const { return plan_; }
  const StageOptions& options() const { return plan_.model; }  // what the stage's model is built with

 private:
  // On the heap, so that a RankStage moves without the groups' references dangling.
  std::unique_ptr<Grid> grid_;
  ProcessGroups groups_;
  StagePlan plan_;
};

// The stage of one rank alone (tp = pp = dp = 1 in `layout`), over a one-rank SoloComm world.
RankStage solo_rank_stage(const ModelConfig& model, const Layout& layout, const StepShape& shape);

}  // namespace jumbo
