#pragma once
// One optimizer step: the stage's microbatches through the pipeline runner (forward and
// backward, gradients accumulating), the gradient sync overlapped with the last backward,
// the global grad norm, clipping, AdamW, and (ZeRO-1) the weight all-gather. Shared by the
// trainer and `jumbo bench train`.
#include <cstdint>
#include <functional>

#include "jumbo/comm/grid.h"
#include "jumbo/model/gpt.h"
#include "jumbo/parallel/groups.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"

namespace jumbo {

// What a step works on, built once by its owner.
struct StepParts {
  GptModel& model;
  PipelineRunner& pipeline;
  GradSync& grad_sync;
  AdamW& optimizer;
  const ProcessGroups& groups;
};

struct StepResult {
  double loss = 0;       // mean per-token loss over the step's global batch
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
  bool applied = false;  // the optimizer updated the weights
};

struct StepRequest {
  int64_t microbatches = 1;  // on this data-parallel rank
  int64_t batch_tokens = 0;  // tokens of the whole global batch: the loss is their mean
  double lr = 0;
  double grad_clip = 0;      // 0 disables clipping
  // Asked at every step once the loss and grad norm are known (the same on every rank),
  // non-finite ones included: whether to update. Empty: update. A step whose loss or norm is
  // not finite never updates, whatever the answer.
  std::function<bool(const StepResult&)> apply_update = nullptr;
  // Runs on the whole gradient buffer before its norm: the test faults' NaN (fault_injection.h).
  std::function<void(Tensor grads)> before_grad_norm = nullptr;
};

// Does not update when the loss or the norm is not finite, or apply_update says no.
StepResult train_step(const StepParts& parts, MicrobatchSource& source, const StepRequest& request);

// The parts of a step on one rank alone, built and owned as the trainer builds its own: for
// `jumbo bench train` and the tests that run the training step without a Trainer.
// `layout` has tp = pp = dp = 1 (its micro batch and device count).
class SoloStep {
 public:
  SoloStep(const ModelConfig& model, const Layout& layout, const StepShape& shape,
           const TrainConfig& train, Backend& backend, uint64_t seed);
  const StepParts& parts() const { return parts_; }
  GptModel& model() { return model_; }

 private:
  StagePlan plan_;
  Grid grid_;
  ProcessGroups groups_;
  GptModel model_;
  AdamW optimizer_;
  GradSync grad_sync_;
  PipelineRunner pipeline_;
  StepParts parts_;
};

}  // namespace jumbo
