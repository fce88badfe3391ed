#include "jumbo/train/step.h"

#include <algorithm>
#include <cmath>

#include "jumbo/comm/watchdog.h"

namespace jumbo {

StepResult train_step(TrainStage& stage, MicrobatchSource& source, const StepRequest& request) {
  ModelStage& model = stage.model();
  GradSync& sync = stage.grad_sync();
  const ProcessGroups& g = stage.groups();
  StepResult r;
  model.zero_grads();
  sync.start_step();
  PipelineRun run;
  run.microbatches = request.microbatches;
  const auto loss_tokens = static_cast<double>(std::max<int64_t>(1, request.loss_tokens));
  run.loss_scale = static_cast<float>(1.0 / loss_tokens);
  run.dropout_seed = request.dropout_seed;
  run.grads_ready = [&sync](int64_t flat) { sync.grads_ready_from(flat); };
  run.weights_needed = [&sync](int64_t flat) { sync.weights_needed_until(flat); };
  double loss_sum = stage.pipeline().run(source, run);
  sync.finish();
  loss_sum = g.dp.all_reduce_scalar(loss_sum, ReduceOp::sum);
  loss_sum = g.pp.all_reduce_scalar(loss_sum, ReduceOp::sum);  // only the last stage has it
  r.loss = loss_sum / loss_tokens;

  const Tensor grads = model.trained_params().all_grads();
  if (request.before_grad_norm) request.before_grad_norm(grads);
  double sq = 0;
  {
    const BlockingOp watch("waiting for the GPU's step (grad norm)", "device");
    sq = stage.optimizer().grad_norm_squared(grads);
  }
  sq = g.grad_norm.all_reduce_scalar(sq, ReduceOp::sum);
  r.grad_norm = std::sqrt(sq);
  if (request.apply_update && !request.apply_update(r)) return r;
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  if (request.grad_clip > 0 && r.grad_norm > request.grad_clip) {
    r.clip_scale = request.grad_clip / r.grad_norm;
  }
  stage.optimizer().step(request.lr, static_cast<float>(r.clip_scale), grads);
  // Overlaps whatever comes next: the next step's forward waits for each bucket it reads.
  sync.start_weight_gather();
  r.applied = true;
  return r;
}

}  // namespace jumbo
