#include "jumbo/train/step.h"

#include <cmath>

namespace jumbo {

StepResult train_step(GptModel& model, AdamW& opt, MicrobatchSource& source, int64_t micro_steps,
                      int64_t batch_tokens, double lr, double grad_clip, int32_t* tokens,
                      int32_t* targets) {
  StepResult r;
  model.zero_grads();
  const float loss_scale = 1.0f / static_cast<float>(batch_tokens);
  double loss_sum = 0;
  for (int64_t k = 0; k < micro_steps; ++k) {
    source.next(tokens, targets);
    loss_sum += model.forward(tokens, targets);
    model.backward(loss_scale);
  }
  r.loss = loss_sum / static_cast<double>(batch_tokens);
  r.grad_norm = grad_norm(model.params(), model.backend());
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  if (grad_clip > 0 && r.grad_norm > grad_clip) r.clip_scale = grad_clip / r.grad_norm;
  opt.step(lr, static_cast<float>(r.clip_scale));
  return r;
}

}  // namespace jumbo
