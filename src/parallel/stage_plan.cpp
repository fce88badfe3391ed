#include "jumbo/parallel/stage_plan.h"

#include <algorithm>
#include <cstdlib>

#include "jumbo/model/lora.h"
#include "jumbo/model/spec.h"

namespace jumbo {

std::vector<int64_t> balance_stage_layers(const ModelConfig& m, int64_t pp) {
  std::vector<int64_t> layers(pp, 1);
  std::vector<double> cost(pp, 1.0);
  // The embedding (first stage) and the head (last) as V h / M layers, M a layer's weight-matrix
  // elements (model/spec.h): V / (12 h) for GPT's 12 h^2.
  const double ends = static_cast<double>(m.padded_vocab()) * static_cast<double>(m.d_model) /
                      static_cast<double>(model_spec(m).layer_matrix_params());
  cost.front() += ends;
  cost.back() += ends;
  for (int64_t left = m.layers - pp; left > 0; --left) {
    // Cheapest stage; on ties the one nearest the middle keeps the ends light.
    int64_t best = 0;
    for (int64_t s = 1; s < pp; ++s) {
      const bool cheaper = cost[s] < cost[best] - 1e-9;
      const bool tie_nearer_middle = std::abs(cost[s] - cost[best]) <= 1e-9 &&
                                     std::abs(2 * s - (pp - 1)) < std::abs(2 * best - (pp - 1));
      if (cheaper || tie_nearer_middle) best = s;
    }
    ++layers[best];
    cost[best] += 1.0;
  }
  return layers;
}

StageLayers stage_layer_range(const ModelConfig& m, const Layout& layout, int64_t stage) {
  StageLayers r;
  const int64_t pp = layout.pp, v = layout.virtual_stages;
  if (v > 1) {
    const int64_t per_chunk = m.layers / (pp * v);
    r.per_stage.assign(static_cast<size_t>(pp), per_chunk * v);
    r.first_layer = stage * per_chunk;
    r.num_layers = per_chunk;
    r.chunks = v;
    r.chunk_stride = pp * per_chunk;
  } else {
    r.per_stage = layout.stage_layers.empty() ? balance_stage_layers(m, pp) : layout.stage_layers;
    for (int64_t s = 0; s < stage; ++s) r.first_layer += r.per_stage[static_cast<size_t>(s)];
    r.num_layers = r.per_stage[static_cast<size_t>(stage)];
  }
  return r;
}

StepShape step_shape_of(const RunConfig& cfg) {
  StepShape s;
  s.global_batch = cfg.train.global_batch;
  s.seq = cfg.model.context;
  s.precision = cfg.train.precision;
  s.eval_microbatches = cfg.train.eval_every > 0 ? cfg.train.eval_batches / cfg.parallel.dp : 0;
  s.lora = cfg.finetune.lora(cfg.model);
  s.lora_dropout = static_cast<float>(cfg.finetune.lora_dropout);
  return s;
}

StagePlan plan_stage(const ModelConfig& model, const Layout& layout, const StepShape& shape,
                     const GridCoords& at) {
  StagePlan plan;
  plan.layers = stage_layer_range(model, layout, at.pp_rank);
  const int pp = static_cast<int>(layout.pp), stage = at.pp_rank;
  const int v = static_cast<int>(layout.virtual_stages);
  plan.microbatches =
      shape.global_batch > 0
          ? std::max<int64_t>(1, shape.global_batch / (layout.micro_batch * layout.dp))
          : layout.pp;
  plan.schedule = pipeline_schedule(pp, stage, static_cast<int>(plan.microbatches), v);
  plan.eval_microbatches = shape.eval_microbatches;

  StageOptions& o = plan.model;
  o.micro_batch = layout.micro_batch;
  o.seq = shape.seq > 0 ? shape.seq : model.context;
  o.compute_dtype = compute_dtype_of(shape.precision);
  o.flat_multiple = layout.dp;
  o.first_layer = plan.layers.first_layer;
  o.num_layers = plan.layers.num_layers;
  o.chunks = plan.layers.chunks;
  o.chunk_stride = plan.layers.chunk_stride;
  o.has_embedding = stage == 0;
  o.has_head = stage == pp - 1;
  // Activation sets: the most microbatches this stage holds at once in its schedule.
  o.slots = max_in_flight(plan.schedule);
  // Losses stay on the device until the end of a run of microbatches: one host read each.
  o.losses_per_read = std::max(plan.microbatches, plan.eval_microbatches);
  o.recompute = layout.recompute;
  o.sequence_parallel = layout.sequence_parallel;
  o.lora = shape.lora;
  o.lora_dropout = shape.lora_dropout;

  for (ParamInfo& info : o.lora.rank > 0 ? lora_stage_params(model, o, at.tp_rank, layout.tp)
                                         : stage_params(model, o, at.tp_rank, layout.tp)) {
    plan.params.add(std::move(info));
  }
  plan.params.pad_to(layout.dp);  // as TransformerStage pads its flat buffers for dp shards
  plan.zero1 = layout.zero1_active();
  if (layout.dp > 1) {
    plan.buckets = dp_buckets(plan.params.total_numel(), layout.dp, layout.bucket_size);
    plan.optimizer_ranges = optimizer_ranges(plan.params, plan.buckets, layout.dp, at.dp_rank,
                                             layout.zero1_active(), &plan.optimizer_state_elems);
    // The grad norm sums this rank's shard of every bucket over the world, with ZeRO-1 or
    // without (every replica has the whole reduced gradient then): the same sums in the same
    // order either way, and 1/dp of the reads.
    const std::vector<OptimRange> shards =
        layout.zero1_active() ? plan.optimizer_ranges
                              : optimizer_ranges(plan.params, plan.buckets, layout.dp, at.dp_rank,
                                                 true, nullptr);
    plan.grad_norm_ranges = grad_norm_ranges(plan.params, shards, at.tp_rank);
  } else {
    plan.optimizer_ranges = all_param_ranges(plan.params);
    plan.optimizer_state_elems = plan.params.total_numel();
    plan.grad_norm_ranges = grad_norm_ranges(plan.params, plan.optimizer_ranges, at.tp_rank);
  }
  return plan;
}

StagePlan plan_stage(const RunConfig& cfg, const GridCoords& at) {
  return plan_stage(cfg.model, cfg.parallel, step_shape_of(cfg), at);
}

}  // namespace jumbo
