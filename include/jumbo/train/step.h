#pragma once
// One optimizer step: the stage's microbatches through the pipeline runner (forward and
// backward, gradients accumulating), the gradient sync overlapped with the last backward,
// the global grad norm, clipping, AdamW, and (ZeRO-1) the weight all-gather, on a rank's
// TrainStage. Shared by the trainer, `jumbo bench train` and the GPU step test.
#include <cstdint>
#include <functional>
#include <optional>

#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/train/train_stage.h"

namespace jumbo {

struct StepResult {
  double loss = 0;       // mean per-token loss over the step's global batch
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
  bool applied = false;  // the optimizer updated the weights
};

struct StepRequest {
  int64_t microbatches = 1;  // on this data-parallel rank
  // The targets the loss counts in the whole global batch (every token of text; an
  // example's completion and EOS): the loss is their mean, the same on every layout.
  int64_t loss_tokens = 0;
  double lr = 0;
  double grad_clip = 0;      // 0 disables clipping
  // The step's seed of the LoRA dropout masks (finetune.lora_dropout): train.seed and the step,
  // so a resumed run draws the same masks.
  std::optional<uint64_t> dropout_seed = std::nullopt;
  // Asked at every step once the loss and grad norm are known (the same on every rank),
  // non-finite ones included: whether to update. Empty: update. A step whose loss or norm is
  // not finite never updates, whatever the answer.
  std::function<bool(const StepResult&)> apply_update = nullptr;
  // Runs on the whole gradient buffer before its norm: the test faults' NaN (fault_injection.h).
  std::function<void(Tensor grads)> before_grad_norm = nullptr;
};

// Does not update when the loss or the norm is not finite, or apply_update says no.
StepResult train_step(TrainStage& stage, MicrobatchSource& source, const StepRequest& request);

}  // namespace jumbo
