#pragma once
// `jumbo ckpt import --format hf-gpt2`: a Hugging Face GPT-2 directory (config.json,
// model.safetensors, a tokenizer) as a jumbo checkpoint, the inverse of
// `ckpt export --format hf-gpt2` (export_hf.h, whose one table of names and layouts it reads).
// The checkpoint is what a tp 1 x pp 1 x dp 1 run saves at step 0: the weights as the master
// state, zero Adam moments, the model read from config.json. See docs/hf-export.md, "Import".
#include <cstdint>
#include <string>

#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/infer/hf_llama.h"

namespace jumbo {

struct HfGpt2ImportOptions {
  std::string source_dir;  // DIR: config.json, model.safetensors, tokenizer.model or BPE files
  std::string out_root;    // -o: a checkpoint root (new, or an empty directory) for step_N/
  std::string tokenizer;   // --tokenizer: a SentencePiece model; empty = DIR/tokenizer.model
};

struct HfGpt2ImportStats {
  ModelConfig model;            // read from config.json
  int64_t tensors = 0;          // GPT-2 tensors read (buffers and a tied lm_head not counted)
  int64_t parameters = 0;
  std::string dtypes;           // of model.safetensors: "F32", "BF16, F16", ...
  std::string checkpoint_dir;   // out_root/step_00000000
  int64_t bytes = 0;            // of the shard file
  std::string tokenizer_from;   // the SentencePiece model copied to out_root/tokenizer.model
};

// Every check that can fail (-o, config.json, every tensor's name, dtype and shape, lm_head
// tied, the tokenizer) runs before anything is written; the manifest is written last. On a
// failure nothing is left at -o (a directory this import created is removed). Throws
// UserError: one line naming the file, key or tensor, the value and what was expected.
HfGpt2ImportStats import_hf_gpt2(const HfGpt2ImportOptions& opts);

// `jumbo ckpt import --format hf`: a Llama-family directory (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM; infer/hf_llama.h), streamed tensor by tensor.
struct HfImportOptions {
  std::string source_dir;  // DIR: config.json, model.safetensors or its index and shards
  std::string out_root;    // -o: a checkpoint root (new, or an empty directory)
};

struct HfImportStats {
  ModelConfig model;
  HfArchitecture architecture = HfArchitecture::llama;
  std::vector<std::string> ignored;  // config.json keys that change nothing jumbo computes
  int64_t files = 0;                 // safetensors files read
  int64_t tensors = 0, parameters = 0;
  std::string dtypes;                // "BF16", "F16, F32", ...
  std::string tokenizer;             // tokenizer.json or tokenizer.model: the checkpoint's
  std::vector<std::string> copied;   // the files beside the checkpoints: the tokenizer's, model.toml
  bool chat_template = false;        // tokenizer_config.json's, recorded in the manifest
  std::string checkpoint_dir;
  int64_t bytes = 0;                 // of the shard file
};

// Every check that can fail (-o, config.json, every tensor's name, dtype and shape, the
// tokenizer) runs before anything is written; on a failure nothing is left at -o. Throws
// UserError: one line naming the file, key or tensor, the value and what was expected.
HfImportStats import_hf(const HfImportOptions& opts);

}  // namespace jumbo
