// The fine-tune's choices and what the plan says about them (docs/plan.md "Fine-tuning").
#include "jumbo/plan/finetune.h"

#include <fmt/format.h>

namespace jumbo {

std::optional<FineTune> parse_fine_tune(std::string_view name) {
  for (FineTune f : {FineTune::full, FineTune::lora})
    if (name == to_string(f)) return f;
  return std::nullopt;
}

AdapterCheckpoint adapter_checkpoint(const ModelConfig& m, const LoraPlan& lora) {
  return AdapterCheckpoint{.params = lora_adapter_params(m, lora.rank, lora.targets)};
}

std::string describe_fine_tune(const ModelConfig& m, FineTune method, const LoraPlan& lora,
                               Precision precision) {
  if (method == FineTune::none) return "";
  if (method == FineTune::full)
    return "full fine-tune: the memory of pre-training (bf16 weights, f32 grads, f32 master and "
           "Adam m, v, ZeRO-1 sharding those three; the same activations), at the fine-tune's "
           "sequence length and global batch\n";
  const AdapterCheckpoint ckpt = adapter_checkpoint(m, lora);
  const double gb = 1e9;
  return fmt::format(
      "LoRA fine-tune, rank {} on {} of every layer: {} adapter parameters ({:.1f}M, {:.3f}% of "
      "the model); the base frozen in {} ({} bytes per parameter: no master, grads or Adam), the "
      "adapters trained as pre-training trains weights (bf16 copy, f32 grads, f32 master and "
      "Adam m, v, ZeRO-1 sharding those three)\n"
      "adapter-only checkpoint: {:.2f} GB ({} bytes) with the f32 master and Adam m, v "
      "(12 bytes per adapter parameter: to resume), {:.2f} GB ({} bytes) with the f32 master "
      "alone (4: to serve or merge); tensor data, the format's metadata left out\n",
      lora.rank, describe(lora.targets), ckpt.params, static_cast<double>(ckpt.params) / 1e6,
      100.0 * static_cast<double>(ckpt.params) / static_cast<double>(parameter_count(m)),
      to_string(precision), precision == Precision::bf16 ? 2 : 4,
      static_cast<double>(ckpt.resume_bytes()) / gb, ckpt.resume_bytes(),
      static_cast<double>(ckpt.weights_bytes()) / gb, ckpt.weights_bytes());
}

}  // namespace jumbo
