#include "jumbo/train/step.h"

#include <cmath>

namespace jumbo {

StepResult train_step(GptModel& model, AdamW& opt, MicrobatchSource& source, int64_t micro_steps,
                      int64_t batch_tokens, double lr, double grad_clip, int32_t* tokens,
                      int32_t* targets, const StepGroups& g) {
  StepResult r;
  model.zero_grads();
  if (g.grad_sync) g.grad_sync->start_step();
  const float loss_scale = 1.0f / static_cast<float>(batch_tokens);
  double loss_sum = 0;
  for (int64_t k = 0; k < micro_steps; ++k) {
    source.next(tokens, targets);
    loss_sum += model.forward(tokens, targets);
    if (g.grad_sync && k == micro_steps - 1) {
      model.set_grads_ready_hook([&](int64_t flat) { g.grad_sync->grads_ready_from(flat); });
    }
    model.backward(loss_scale);
  }
  model.set_grads_ready_hook(nullptr);
  if (g.grad_sync) g.grad_sync->finish();
  if (g.loss_group) loss_sum = g.loss_group->all_reduce_scalar(loss_sum, ReduceOp::sum);
  r.loss = loss_sum / static_cast<double>(batch_tokens);

  Tensor grads = g.grad_sync ? g.grad_sync->optimizer_grads() : model.params().all_grads();
  double sq = grad_norm_squared(model.params(), opt.ranges(), grads, model.backend(), g.tp_rank);
  if (g.norm_group) sq = g.norm_group->all_reduce_scalar(sq, ReduceOp::sum);
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  if (grad_clip > 0 && r.grad_norm > grad_clip) r.clip_scale = grad_clip / r.grad_norm;
  opt.step(lr, static_cast<float>(r.clip_scale), grads);
  if (g.grad_sync) g.grad_sync->gather_weights();
  return r;
}

}  // namespace jumbo
