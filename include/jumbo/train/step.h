#pragma once
// One optimizer step: microbatches through forward and backward (gradient accumulation),
// global grad norm, clipping, AdamW. Shared by the trainer and `jumbo bench train`.
#include <cstdint>

#include "jumbo/model/gpt.h"
#include "jumbo/train/optimizer.h"

namespace jumbo {

// Supplies microbatches: fills tokens and targets (micro_batch x seq ids each).
class MicrobatchSource {
 public:
  virtual ~MicrobatchSource() = default;
  virtual void next(int32_t* tokens, int32_t* targets) = 0;
};

struct StepResult {
  double loss = 0;       // mean per-token loss over the step's batch
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
};

// Runs `micro_steps` microbatches; `batch_tokens` is the tokens of the whole global batch (the
// loss is their mean). Does not update when loss or norm is not finite (the caller stops).
StepResult train_step(GptModel& model, AdamW& opt, MicrobatchSource& source, int64_t micro_steps,
                      int64_t batch_tokens, double lr, double grad_clip, int32_t* tokens,
                      int32_t* targets);

}  // namespace jumbo
