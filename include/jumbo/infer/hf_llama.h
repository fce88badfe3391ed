#pragma once
// The Llama family as Hugging Face stores it (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM): config.json <-> the model keys, and the one table of tensor names and row
// layouts that `jumbo ckpt import --format hf` reads one way and `ckpt export --format hf` (and
// `--format peft`) the other. Weights are used in Hugging Face's rotary convention as they are
// (jumbo's RoPE is transformers' rotate_half: no permutation). docs/hf-export.md.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

enum class HfArchitecture : uint8_t { llama, mistral, qwen2 };
const char* hf_architecture_name(HfArchitecture a);  // "LlamaForCausalLM", ...

struct HfModelConfig {
  ModelConfig model;
  HfArchitecture architecture = HfArchitecture::llama;
  std::vector<std::string> ignored;  // keys present that do not change the computation
  std::string torch_dtype;           // as written, or ""
};

// config.json as the model keys. Refuses (UserError, one line naming the file, the key and
// the value) an architecture, a rope_scaling type or a field that changes the computation and
// that jumbo does not implement (sliding window, yarn, MoE, soft-capping, ...), and any key it
// does not know; keys that change nothing are listed in `ignored`.
HfModelConfig read_hf_model_config(const std::string& config_path, const std::string& name);

// The architecture a model exports as: Qwen2 for q/k/v biases without other biases, else
// Llama (Mistral's architecture is Llama's: it loads as LlamaForCausalLM). Throws UserError
// naming `where` when the model is not of the family (LayerNorm, learned positions, GELU,
// qk-norm).
HfArchitecture hf_architecture_of(const ModelConfig& model, const std::string& where);

// config.json for `model` as transformers writes it for `architecture`.
nlohmann::ordered_json hf_model_config_json(const ModelConfig& model, HfArchitecture architecture,
                                            int64_t bos_id, int64_t eos_id,
                                            const std::string& torch_dtype);

// One Hugging Face tensor and where its rows are in a jumbo tensor: row i of the HF tensor is
// row jumbo_rows[i] of jumbo's (empty: row i; 1-d tensors are one column).
struct HfTensor {
  std::string hf_name;               // "model.layers.3.self_attn.k_proj.weight"
  std::vector<int64_t> hf_shape;     // [rows, cols] or [rows]
  std::string jumbo_name;            // "layers.3.attn.qkv.weight"
  std::vector<int64_t> jumbo_rows;
};

// Every tensor of the model in transformers' state-dict order: the embedding, per layer
// q/k/v (their rows of jumbo's grouped q/k/v weight), o, gate, up, down, the two norms; the
// final norm; lm_head unless tied. jumbo's real shapes: the embedding and head have
// model.vocab rows.
std::vector<HfTensor> hf_llama_table(const ModelConfig& model);

// Rows of jumbo's grouped q/k/v map (groups of R query heads, a key head, a value head) that
// are HF's q_proj, k_proj or v_proj rows, in HF's order (`part`: 0 q, 1 k, 2 v).
std::vector<int64_t> hf_qkv_rows(const ModelConfig& model, int part);

// The HF module a jumbo map is ("self_attn.q_proj", "mlp.down_proj", ...), by the LoRA
// target names of the maps (model/lora.h): PEFT's target_modules.
const char* hf_module_of(LoraTarget target);

}  // namespace jumbo
