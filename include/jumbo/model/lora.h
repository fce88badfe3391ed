#pragma once
// LoRA adapters of a pipeline stage (Hu et al. 2021): per layer and target map, A [r x in]
// (initialised N(0, 1/in)) and B [out x r] (zeros, so a fresh adapter leaves the base model's
// outputs exactly), sharded as their base map over tensor parallelism: column-parallel (qkv,
// fc1, and the parts q, k, v, gate, up) keep A whole, B by output rows, and A's gradient is a
// partial sum over tp (each rank back-propagates only its output slice); row-parallel (proj,
// fc2) split A by input columns and keep B whole. Names: "layers.N.attn.qkv.lora_a",
// "...lora_b", likewise attn.q, attn.k, attn.v, attn.proj, mlp.fc1, mlp.gate, mlp.up, mlp.fc2
// (docs/finetune.md).
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/model/stage.h"
#include "jumbo/model/layer.h"

namespace jumbo {

// The stage's adapters in the order their store holds them: layer after layer, in each the
// targets' A then B in LoraTarget order. Empty without opts.lora.
std::vector<ParamInfo> lora_stage_params(const ModelConfig& cfg, const StageOptions& opts,
                                         int64_t tp_rank, int64_t tp_size);
// Where each of the stage's layers' adapters sits in that order.
std::vector<LoraLayerParams> lora_layer_index(const StageOptions& opts);
// A target's outputs, whole (B's rows over every tp rank): its base map's, or its part's.
int64_t lora_output_width(const ModelSpec& spec, LoraTarget target);
// The name of a layer's adapter matrix ("layers.3.mlp.fc1.lora_b").
std::string lora_param_name(int64_t layer, LoraTarget target, bool b_matrix);
// The base weight a target adapts ("layers.3.mlp.fc1.weight"; q, k and v adapt rows of
// "attn.qkv.weight": lora_output_blocks says which).
std::string lora_base_name(int64_t layer, LoraTarget target);

}  // namespace jumbo
