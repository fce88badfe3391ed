#pragma once
// Memory per device of a training layout, before anything is allocated: the formulas of
// docs/plan.md. Two targets share the weights/grads/optimizer accounting and differ in what a
// layer keeps for its backward:
//  - gpu: what Megatron-LM keeps in bf16 with flash attention (Korthikanti et al. 2022
//    without dropout and without the s x s softmax), ZeRO-1 sharding master weights and Adam;
//  - cpu: exactly the tensors jumbo's CPU backend allocates (fp32 attention probabilities,
//    the fp32 master kept whole under ZeRO-1), so a CPU run can check the model against its
//    measured peak.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/config/layout.h"
#include "jumbo/plan/finetune.h"

namespace jumbo {

enum class PlanDevice { cpu, gpu };

struct PlanTarget {
  PlanDevice device = PlanDevice::gpu;
  Precision precision = Precision::bf16;
  int64_t global_batch = 0;  // sequences per step: sets the microbatches per pipeline
  int64_t seq = 0;           // tokens per sequence; 0 = model.context
  FineTune fine_tune = FineTune::none;  // none and full hold the same; lora: docs/plan.md
  LoraPlan lora;                        // with FineTune::lora
};

// Bytes on one device of one pipeline stage (the worst stage when returned by estimate_memory).
struct MemoryEstimate {
  int64_t stage = 0;
  int64_t layers = 0;          // transformer layers this stage holds
  int64_t params = 0;          // parameters this device holds (its tp shard of the stage)
  // The parameters the optimizer updates on this device, padded to a multiple of dp: params,
  // or the stage's adapters (its tp shard) with LoRA. weights, grads and optimizer count these.
  int64_t trained_params = 0;
  double frozen_weights = 0;   // LoRA: the base in the compute dtype, nothing else kept for it
  int64_t microbatches = 0;    // per step on each pipeline: global_batch / (micro_batch x dp)
  int64_t in_flight = 0;       // microbatches whose activations are held at once (1F1B)
  double weights = 0;          // compute copy of the weights (+ fp32 master when not sharded)
  double grads = 0;            // fp32 main gradients
  double optimizer = 0;        // Adam moments (+ the fp32 master shard under ZeRO-1 on gpu)
  double activations = 0;      // kept for the backward, all microbatches in flight
  double workspace = 0;        // per-step buffers, runtime, libraries
  double total() const {
    return frozen_weights + weights + grads + optimizer + activations + workspace;
  }
};

// The layout's stage plan (parallel/stage_plan.h) says what the stage holds: its layers,
// parameters and activation slots; these functions count their bytes.
MemoryEstimate estimate_stage_memory(const ModelConfig& m, const Layout& l, const PlanTarget& t,
                                     int64_t stage);
// The stage that needs the most memory.
MemoryEstimate estimate_memory(const ModelConfig& m, const Layout& l, const PlanTarget& t);

// The fixed part of the workspace: CUDA context, NCCL and cuBLAS buffers, allocator slack
// on a GPU; binary, libraries, MPI and OpenBLAS on a CPU rank of a world of that many ranks.
double runtime_bytes(PlanDevice device, int64_t world);

}  // namespace jumbo
