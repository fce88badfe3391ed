#pragma once
// The stage plan: everything one rank of a layout holds and runs, as a pure function of the
// model, the layout, the step's shape and the rank's grid coordinates — its layers (the
// stage split), its StageOptions, its pipeline schedule and activation slots, the dp buckets of
// its flat parameter buffer and the optimizer ranges it updates. The trainer builds its
// model from it; the planner, checkpoint conversion and the benchmarks read ranks they never
// build from the same function.
#include <cstdint>
#include <utility>
#include <vector>

#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"
#include "jumbo/model/stage.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/pipeline_schedule.h"
#include "jumbo/parallel/sharding.h"

namespace jumbo {

// Balanced split of model.layers over pp stages, counting the embedding on the first stage
// and the head on the last as V / (12 h) layers each: that is the head's FLOPs relative to one
// layer's (2 V h against 24 h^2 per token) and the embedding's parameters relative to one
// layer's (V h against 12 h^2). Every stage gets at least one layer; the extra layers go to
// the cheapest stage, middle stages first. J1-Jumbo (76 layers) on 8 stages: 8 10 10 10 10 10 10 8.
std::vector<int64_t> balance_stage_layers(const ModelConfig& m, int64_t pp);

// The layers pipeline rank `stage` holds: [first_layer, first_layer + num_layers) in each of
// `chunks` model chunks, chunk_stride layers apart. Interleaved (virtual_stages v > 1): the
// layers cut into pp x v equal chunks, rank r holding chunks r, r + pp, ...; otherwise one
// chunk per stage from layout.stage_layers (empty: balance_stage_layers).
struct StageLayers {
  int64_t first_layer = 0, num_layers = 0, chunks = 1, chunk_stride = 0;
  std::vector<int64_t> per_stage;  // layers held by each pipeline rank
};
StageLayers stage_layer_range(const ModelConfig& m, const Layout& layout, int64_t stage);

// What a step is made of besides the layout.
struct StepShape {
  int64_t global_batch = 0;        // sequences per optimizer step at the full batch; 0 = one
                                   // microbatch per pipeline stage (for callers that lay out
                                   // state, not steps: conversion, checkpoint benchmarks)
  int64_t seq = 0;                 // tokens per sequence; 0 = model.context
  Precision precision = Precision::fp32;
  int64_t eval_microbatches = 0;   // microbatches of one forward-only run on this rank
  LoraShape lora{};                // LoRA: the adapters are what trains (rank 0: every weight)
  float lora_dropout = 0;          // training's dropout of the adapters' input
};
StepShape step_shape_of(const RunConfig& cfg);

struct StagePlan {
  StageLayers layers;
  StageOptions model;  // what the stage's model is built with (make_model_stage)
  // Microbatches per step on this data-parallel rank at the full global batch (the batch
  // ramp only shrinks it), and this rank's pipeline schedule for them (with pp = 1: forward,
  // backward per microbatch).
  int64_t microbatches = 1;
  std::vector<PipeOp> schedule;
  int64_t eval_microbatches = 0;  // of one forward-only run (evaluation) on this rank
  // The stage's trained parameters as the model stage registers them (layout only: nothing
  // allocated), padded to a multiple of dp: every weight, or with LoRA the adapters alone
  // (the frozen base has no gradient, optimizer state or checkpoint shard). The buckets,
  // optimizer and grad-norm ranges below are over these.
  ParamStore params;
  std::vector<std::pair<int64_t, int64_t>> buckets;  // dp buckets; empty without dp
  bool zero1 = false;                                 // ZeRO-1 in effect (dp > 1)
  std::vector<OptimRange> optimizer_ranges;           // what this rank's optimizer updates
  int64_t optimizer_state_elems = 0;                  // length of Adam's moments
  std::vector<OptimRange> grad_norm_ranges;           // what it adds to the gradient norm
};

// `layout` must be valid for `model` (validate_layout) and its dp set.
StagePlan plan_stage(const ModelConfig& model, const Layout& layout, const StepShape& shape,
                     const GridCoords& at);
// The same for a run config whose layout is set for its world (validated_for_world).
StagePlan plan_stage(const RunConfig& cfg, const GridCoords& at);

}  // namespace jumbo
