#pragma once
// PipelineRunner: runs one stage's microbatches in its schedule's order — 1F1B (or
// interleaved 1F1B) for training, the same forwards alone for evaluation and inference — with
// the stage boundary tensors over non-blocking point-to-point (Megatron-Core's one schedule
// with forward_only). Without a pipeline (pp = 1) the schedule is forward, backward per
// microbatch and nothing is sent. It owns the schedule and its bookkeeping: which activation
// slot holds each (microbatch, chunk) in flight and the sends not yet waited for.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/model/stage.h"
#include "jumbo/parallel/pipeline_exchange.h"
#include "jumbo/parallel/pipeline_schedule.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

// One microbatch's host inputs, micro_batch x seq each: tokens, targets (a negative target is
// not in the loss) and, for sources that hold packed examples, each token's position in its
// own sequence (attention stays inside it); positions is null otherwise.
struct MicrobatchView {
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  int32_t* positions = nullptr;
};

// Supplies microbatches.
class MicrobatchSource {
 public:
  virtual ~MicrobatchSource() = default;
  virtual void next(const MicrobatchView& microbatch) = 0;
  // Whether it fills positions (prompt-completion examples): the model then reads them.
  virtual bool holds_examples() const { return false; }
};

struct PipelineRun {
  PipelineMode mode = PipelineMode::train;
  int64_t microbatches = 1;
  float loss_scale = 1.0f;  // train: the weight of each token's loss in the backward
  // train: installed for the last microbatch's backward (ModelStage::set_grads_ready_hook):
  // called each time every gradient at flat offset >= its argument is final.
  std::function<void(int64_t)> grads_ready;
  // Installed for the run's forwards (ModelStage::set_weights_needed_hook): called before the
  // weights below its argument are first read (ZeRO's overlapped weight gather).
  std::function<void(int64_t)> weights_needed;
  // forward_only: when set, the per-token losses are appended here (on the stage with the
  // head, in microbatch and token order) and run() returns their sum.
  std::vector<float>* token_losses = nullptr;
  // train: the step's seed of the LoRA dropout masks (ModelStage::begin_run); forward_only
  // never drops.
  std::optional<uint64_t> dropout_seed = std::nullopt;
};

class PipelineRunner {
 public:
  // `pp` is the rank's pipeline group (rank = stage); the plan gives the stage, its chunks,
  // its activation slots and the full batch's schedule.
  PipelineRunner(ModelStage& model, Comm& pp, const StagePlan& plan);

  // Runs `run.microbatches` microbatches from `source` through this stage and returns the
  // sum of their per-token losses on the stage with the head (0 elsewhere), read from the
  // device once. The source is read on the stages that embed tokens or score targets.
  double run(MicrobatchSource& source, const PipelineRun& run);

 private:
  // This stage's ops for `microbatches` in `mode`; rebuilt only when the count changes
  // (during the batch ramp-up).
  struct Schedule {
    int64_t microbatches = -1;
    std::vector<PipeOp> ops;
    std::vector<PipeExchange> exchanges;  // how its transfers are posted
  };
  const Schedule& schedule(PipelineMode mode, int64_t microbatches);

  ModelStage& model_;
  Comm& pp_;
  int stages_, stage_, chunks_;
  Schedule train_, forward_only_;
  // The microbatch read last; with packed examples one per microbatch of the run.
  size_t tokens_per_microbatch_ = 0;
  std::vector<int32_t> tokens_, targets_, positions_;
  std::vector<int> slot_of_;  // [microbatch * chunks + chunk]
  std::vector<int> free_slots_;
  std::vector<CommRequest> fwd_sent_, bwd_sent_;  // per slot
  std::vector<CommRequest> received_;             // per op of the schedule run
};

}  // namespace jumbo
