#pragma once
// One optimizer step: microbatches through forward and backward (gradient accumulation),
// data-parallel gradient reduction overlapped with the last backward, global grad norm,
// clipping, AdamW, and (ZeRO-1) the weight all-gather. Shared by the trainer and
// `jumbo bench train`.
#include <cstdint>

#include "jumbo/model/gpt.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"
#include "jumbo/train/pipeline_schedule.h"

namespace jumbo {

// Supplies microbatches: fills tokens and targets (micro_batch x seq ids each).
class MicrobatchSource {
 public:
  virtual ~MicrobatchSource() = default;
  virtual void next(int32_t* tokens, int32_t* targets) = 0;
};

// Bookkeeping of a pipeline stage's step, sized once by the trainer: which activation set
// holds each (microbatch, chunk) in flight, and the sends not yet waited for.
struct PipelineState {
  int chunks = 1;
  std::vector<int> slot_of;      // [microbatch * chunks + chunk]
  std::vector<int> free_slots;
  std::vector<CommRequest> fwd_sent, bwd_sent;  // per slot
  void reset(int slots, int max_microbatches, int virtual_stages);
};

// Where a step's partial results are combined. Defaults: one rank.
struct StepGroups {
  GradSync* grad_sync = nullptr;  // data parallel: bucketed reduction of the main grads
  Comm* loss_group = nullptr;     // sums the loss over data-parallel ranks
  Comm* norm_group = nullptr;     // sums the grad norm's squares (model-parallel, or world)
  Comm* embedding = nullptr;      // first + last stage: sums the tied embedding's gradient
  Comm* pp = nullptr;             // pipeline: this rank's stage neighbours (rank = stage)
  Comm* tp = nullptr;             // sequence parallel: sums the norms' partial gradients
  const std::vector<PipeOp>* schedule = nullptr;  // pipeline: this stage's ops for the step
  PipelineState* pipeline = nullptr;
  int tp_rank = 0;
};

struct StepResult {
  double loss = 0;       // mean per-token loss over the step's global batch
  double grad_norm = 0;  // before clipping
  double clip_scale = 1;
};

// Runs `micro_steps` microbatches on this rank; `batch_tokens` is the tokens of the whole
// global batch (the loss is their mean). Does not update when loss or norm is not finite.
StepResult train_step(GptModel& model, AdamW& opt, MicrobatchSource& source, int64_t micro_steps,
                      int64_t batch_tokens, double lr, double grad_clip, int32_t* tokens,
                      int32_t* targets, const StepGroups& groups = {});

}  // namespace jumbo
