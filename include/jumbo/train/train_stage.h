#pragma once
// TrainStage: one rank's training parts, built once and owned together — its RankStage (grid,
// process groups, stage plan), the model stage with its initialized weights, the gradient
// sync, AdamW and the pipeline runner: what train_step works on. The trainer builds it after
// its checks and data (a mistake fails before anything is allocated); `jumbo bench train` and
// the GPU step test build it too, on one rank alone over a SoloComm.
#include <cstdint>

#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"
#include "jumbo/model/stage.h"
#include "jumbo/parallel/groups.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/parallel/rank_stage.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"

namespace jumbo {

class TrainStage {
 public:
  // Allocates the stage's model on `backend` as `place` plans it, initializes its weights
  // from train.seed, then the gradient sync, AdamW (train's hyperparameters and precision; its
  // mixed-precision master from those weights) and the pipeline runner.
  TrainStage(RankStage place, const ModelConfig& model, const TrainConfig& train,
             Backend& backend);
  TrainStage(const TrainStage&) = delete;
  TrainStage& operator=(const TrainStage&) = delete;

  Grid& grid() { return place_.grid(); }
  const ProcessGroups& groups() const { return place_.groups(); }
  const StagePlan& plan() const { return place_.plan(); }
  ModelStage& model() { return *model_; }
  const ModelStage& model() const { return *model_; }
  GradSync& grad_sync() { return grad_sync_; }
  AdamW& optimizer() { return optimizer_; }
  const AdamW& optimizer() const { return optimizer_; }
  PipelineRunner& pipeline() { return pipeline_; }

 private:
  RankStage place_;
  std::unique_ptr<ModelStage> model_;
  GradSync grad_sync_;
  AdamW optimizer_;
  PipelineRunner pipeline_;
};

// One rank alone (`layout` has tp = pp = dp = 1: its micro batch and device), for `jumbo
// bench train` and the tests that run the training step without a Trainer.
TrainStage solo_train_stage(const ModelConfig& model, const Layout& layout,
                            const StepShape& shape, const TrainConfig& train, Backend& backend);

}  // namespace jumbo
