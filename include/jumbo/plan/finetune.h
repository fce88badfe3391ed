#pragma once
// What a fine-tune changes in the plan (docs/plan.md "Fine-tuning"): a full fine-tune holds
// what pre-training holds; LoRA freezes the base in bf16 and trains adapters on the chosen
// maps of every layer (model/flops.h counts them).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "jumbo/config/config.h"
#include "jumbo/model/flops.h"

namespace jumbo {

// "full" or "lora" (none is not a flag value: no --finetune is pre-training).
std::optional<FineTune> parse_fine_tune(std::string_view name);
inline constexpr const char* kFineTuneChoices = "full or lora";


struct LoraPlan {
  int64_t rank = 16;
  LoraTargetSet targets;  // all four by default
};

// An adapter-only checkpoint, tensor data (the format's metadata, ~1.4 KiB per tensor, is
// left out): to resume, the fp32 master and Adam's m and v, 12 bytes per adapter parameter;
// to serve or merge, the fp32 master alone, 4.
struct AdapterCheckpoint {
  int64_t params = 0;
  int64_t resume_bytes() const { return 12 * params; }
  int64_t weights_bytes() const { return 4 * params; }
};
AdapterCheckpoint adapter_checkpoint(const ModelConfig& m, const LoraPlan& lora);

// The lines under the plan's heading that say what the fine-tune holds (empty for none).
std::string describe_fine_tune(const ModelConfig& m, FineTune method, const LoraPlan& lora,
                               Precision precision);

}  // namespace jumbo
