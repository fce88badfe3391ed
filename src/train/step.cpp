#include "jumbo/train/step.h"

#include <cmath>

#include "jumbo/comm/watchdog.h"

namespace jumbo {

StepResult train_step(const StepParts& parts, MicrobatchSource& source, const StepRequest& request) {
  GptModel& model = parts.model;
  GradSync& sync = parts.grad_sync;
  const ProcessGroups& g = parts.groups;
  StepResult r;
  model.zero_grads();
  sync.start_step();
  PipelineRun run;
  run.microbatches = request.microbatches;
  run.loss_scale = 1.0f / static_cast<float>(request.batch_tokens);
  run.grads_ready = [&sync](int64_t flat) { sync.grads_ready_from(flat); };
  run.weights_needed = [&sync](int64_t flat) { sync.weights_needed_until(flat); };
  double loss_sum = parts.pipeline.run(source, run);
  sync.finish();
  loss_sum = g.dp.all_reduce_scalar(loss_sum, ReduceOp::sum);
  loss_sum = g.pp.all_reduce_scalar(loss_sum, ReduceOp::sum);  // only the last stage has it
  r.loss = loss_sum / static_cast<double>(request.batch_tokens);

  const Tensor grads = model.params().all_grads();
  if (request.before_grad_norm) request.before_grad_norm(grads);
  double sq = 0;
  {
    const BlockingOp watch("waiting for the GPU's step (grad norm)", "device");
    sq = parts.optimizer.grad_norm_squared(grads);
  }
  sq = g.grad_norm.all_reduce_scalar(sq, ReduceOp::sum);
  r.grad_norm = std::sqrt(sq);
  if (request.apply_update && !request.apply_update(r)) return r;
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  if (request.grad_clip > 0 && r.grad_norm > request.grad_clip) {
    r.clip_scale = request.grad_clip / r.grad_norm;
  }
  parts.optimizer.step(request.lr, static_cast<float>(r.clip_scale), grads);
  // Overlaps whatever comes next: the next step's forward waits for each bucket it reads.
  sync.start_weight_gather();
  r.applied = true;
  return r;
}

namespace {
// The model's weights are initialized before the optimizer's master is built from them.
GptModel& initialized(GptModel& model, uint64_t seed) {
  model.initialize(seed);
  return model;
}
}  // namespace

SoloStep::SoloStep(const ModelConfig& model, const Layout& layout, const StepShape& shape,
                   const TrainConfig& train, Backend& backend, uint64_t seed)
    : plan_(plan_stage(model, layout, shape, GridCoords{})),
      grid_(make_solo_comm("world"), 1, 1),
      groups_(process_groups(grid_)),
      model_(model, plan_.model, backend, groups_.tp),
      optimizer_(initialized(model_, seed).params(), backend, train, plan_),
      grad_sync_(model_.params(), groups_, plan_),
      pipeline_(model_, groups_.pp, plan_),
      parts_{model_, pipeline_, grad_sync_, optimizer_, groups_} {}

}  // namespace jumbo
