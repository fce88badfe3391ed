#pragma once
// Parameter counts and model FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language
// Model Training on GPU Clusters", appendix; Megatron-LM's code counts causal attention at half).
#include <cstdint>
#include <string>

#include "jumbo/config/config.h"

namespace jumbo {

// Exact count of this implementation's parameters (padded vocabulary included).
int64_t parameter_count(const ModelConfig& m, int64_t tp = 1);
// The closed form with the unpadded vocabulary: for the GPT block the paper's
// 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)); otherwise written from the spec's pieces
// (grouped-query attention, SwiGLU's three maps, RMSNorm's one vector, an untied head).
double parameter_count_formula(const ModelConfig& m);
// That formula as text, for printing next to its value.
std::string parameter_count_formula_text(const ModelConfig& m);
// Model FLOPs of one training iteration (forward + backward, no recomputation) for `sequences`
// sequences of length s: 6 B s (l M + V h) + 6 B s^2 l H D, M a layer's weight-matrix
// elements, with the padded vocabulary; for the GPT block 72 B s l h^2 (1 + s/(12h) +
// V/(12 l h)). Causal attention counted at half (s/(12h) rather than the paper's s/(6h)).
double model_flops_per_iteration(const ModelConfig& m, int64_t sequences, int64_t seq);
double model_flops_per_token(const ModelConfig& m, int64_t seq);
// LoRA adapters (config.h: LoraTarget, LoraTargetSet).
// One layer's adapters on one of tp ranks, sharded as their base map: column-parallel (qkv,
// fc1) split B by output and replicate A; row-parallel (proj, fc2) split A by input and
// replicate B. The whole layer's count is tp x split + replicated.
struct LoraLayerShard {
  int64_t split = 0;       // this rank's part of the tp-split matrices
  int64_t replicated = 0;  // matrices every tp rank holds whole
  int64_t held() const { return split + replicated; }
};
LoraLayerShard lora_layer_adapters(const ModelConfig& m, int64_t rank, LoraTargetSet targets,
                                   int64_t tp = 1);
// Every layer's adapters, whole: layers x rank x the sum of (in + out) over the targets.
int64_t lora_adapter_params(const ModelConfig& m, int64_t rank, LoraTargetSet targets);

// The formula, for printing next to the numbers.
inline constexpr const char* kModelFlopsFormula =
    "6 B s (l M + V h) + 6 B s^2 l H D, M = a layer's matrix elements (GPT: 72 B s l h^2 (1 + "
    "s/(12h) + V/(12 l h)))  [Narayanan et al. 2021; causal attention at half]";

}  // namespace jumbo
