#pragma once
// `jumbo ckpt export --format hf-gpt2`: a checkpoint as a Hugging Face GPT-2 directory
// (config.json, model.safetensors, the SentencePiece tokenizer and its configs), loadable by
// transformers' GPT2LMHeadModel; and the table of names and layouts that `ckpt import`
// (import_hf.h) reads back. jumbo's model is GPT-2's architecture (docs/hf-export.md); only
// names and layouts change, so this knowledge lives here, above the model and the tokenizer,
// while ckpt/ writes the files without knowing either (ckpt/safetensors.h, write_safetensors).
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/ckpt/resolve.h"
#include "jumbo/ckpt/safetensors.h"
#include "jumbo/ckpt/safetensors_shards.h"
#include "jumbo/config/config.h"
#include "jumbo/infer/hf_llama.h"

namespace jumbo {

struct HfGpt2Options {
  std::string out_dir;    // -o: a local directory, created if missing
  std::string dtype = "f32";  // --dtype: f32 or bf16
  std::string tokenizer;  // --tokenizer: empty = the manifest's data.tokenizer
};

struct HfGpt2Stats {
  ExportStats weights;    // model.safetensors
  std::string tokenizer;  // the SentencePiece model copied to tokenizer.model
  int32_t eos_id = 0;
};

// How a GPT-2 tensor's elements differ from its jumbo tensor's (named fields, no flags).
struct HfGpt2Change {
  bool transposed = false;     // Conv1D: GPT-2 stores [in, out], the transpose of jumbo's [out, in]
  bool qkv_regrouped = false;  // c_attn: jumbo's row r is GPT-2's row hf_gpt2_qkv_order[r]
};

// One GPT-2 tensor and the jumbo tensor it is. The one table of names and layouts, read by
// the export (jumbo -> GPT-2) and the import (infer/import_hf.h, GPT-2 -> jumbo).
struct HfGpt2Tensor {
  std::string jumbo_name;            // "layers.3.attn.qkv.weight"
  std::string hf_name;               // "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> jumbo_shape;  // its real shape: model.vocab rows for the embedding
  HfGpt2Change change;
  std::vector<int64_t> hf_shape() const;  // jumbo_shape, or its transpose
};

// Every tensor of GPT2LMHeadModel for `model`, in GPT-2's order (wte, wpe, the layers, ln_f),
// without I/O: names (layers.N.attn.qkv -> transformer.h.N.attn.c_attn, ...), Conv1D weights
// as the transpose of jumbo's [out, in], and c_attn's output columns regrouped from jumbo's
// per-head q|k|v rows to [q of all heads | k of all heads | v of all heads].
std::vector<HfGpt2Tensor> hf_gpt2_table(const ModelConfig& model);

// The table as write_safetensors' rearrangements (jumbo -> GPT-2).
std::vector<SafetensorsTensor> hf_gpt2_tensors(const ModelConfig& model);

// The row of GPT-2's c_attn output (0 .. 3 d_model) that jumbo's qkv row r becomes.
std::vector<int64_t> hf_gpt2_qkv_order(int64_t d_model, int64_t heads);

// Writes the directory. Every check that can fail (dtype, the checkpoint's tensors and shapes,
// the tokenizer) runs before anything is written; the weights stream as in write_safetensors.
// Throws UserError (one line naming the flag or file).
HfGpt2Stats export_hf_gpt2(const ResolvedCheckpoint& ckpt, const HfGpt2Options& opts);

// `jumbo ckpt export --format hf` (and `--format peft`): the Llama family (infer/hf_llama.h).
struct HfExportOptions {
  std::string out_dir;                         // -o: a local directory, created if missing
  std::string dtype = "f32";                   // --dtype: f32 or bf16
  int64_t max_shard_bytes = kHfMaxShardBytes;  // --max-shard-size
};

struct HfExportStats {
  HfArchitecture architecture = HfArchitecture::llama;
  std::vector<std::string> files;  // the safetensors files, in order
  int64_t tensors = 0, parameters = 0, bytes = 0;
  int64_t merged_maps = 0;         // a LoRA checkpoint's adapters merged into its base
  int32_t eos_id = 0;
};

// config.json, model.safetensors or model-0000i-of-0000n.safetensors with their index (5 GB
// files, as save_pretrained), the tokenizer files and generation_config.json. A LoRA
// checkpoint exports merged into its base (W + alpha/r B A, as `ckpt merge`). Streams: memory
// holds a few tensors. On a failure a directory this created is removed. Throws UserError.
HfExportStats export_hf(const ResolvedCheckpoint& ckpt, const HfExportOptions& opts);

// A LoRA checkpoint's adapters as PEFT writes them: adapter_config.json (r, lora_alpha,
// target_modules) and adapter_model.safetensors (base_model.model.model.layers.N.<module>.
// lora_A/lora_B.weight). A fused qkv adapter becomes q_proj, k_proj and v_proj adapters that
// share its A.
HfExportStats export_peft(const ResolvedCheckpoint& ckpt, const HfExportOptions& opts);

}  // namespace jumbo
