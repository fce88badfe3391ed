#pragma once
// What every verb that runs a trained checkpoint opens first (OpenedCheckpoint: eval,
// generate, serve): the backend and world of this rank, the checkpoint found on rank 0, the
// tokenizer, the precision to run in; and for generate and serve the InferenceSession on top
// of it, the generation engine with its weights loaded. Their flags: src/cli/inference_flags.h.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/comm/comm.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/engine.h"

namespace jumbo {

struct CheckpointOptions {
  std::string checkpoint;  // --checkpoint: a step directory or a root with `latest`
  std::string tokenizer;   // --tokenizer: default the checkpoint's data.tokenizer
  int64_t tp = 1, pp = 1;  // --tp, --pp: any layout, whatever the checkpoint was saved in
  Device device = Device::cpu;          // --device
  std::optional<Precision> precision;  // --precision; default the checkpoint's
  CommEmulation comm_emulate = CommEmulation::none;  // --comm-emulate (comm.emulate's values)
};

struct OpenedCheckpoint {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<Comm> world;
  ResolvedCheckpoint checkpoint;
  std::optional<Tokenizer> tokenizer;  // on world rank 0 only (it encodes and decodes)
  Precision precision = Precision::fp32;  // --precision, else the checkpoint's
};

// Collective. Throws UserError (one line naming the flag or file) on a bad option, a
// missing checkpoint or tokenizer, or a tokenizer with more pieces than model.vocab.
OpenedCheckpoint open_checkpoint_for(const CheckpointOptions& opts, const std::string& verb);

// A LoRA adapter over the checkpoint: --adapter NAME=PATH (serve), --adapter PATH (generate).
struct AdapterSpec {
  std::string name, path;
};

struct InferenceOptions : CheckpointOptions {
  int64_t max_batch = 8;          // --max-batch: sequences decoded together (KV-cache slots)
  int64_t prefill_chunk = 256;    // --prefill-chunk: prompt tokens a step may add
  std::vector<AdapterSpec> adapters;  // loaded into adapter slots 0, 1, ... in order
  int64_t max_adapters = 0;   // --max-adapters: adapter slots; 0 = as many as given
  int64_t max_lora_rank = 0;  // --max-lora-rank: a slot's; 0 = the largest given, else 16
};

struct LoadedAdapter {
  AdapterSpec spec;
  int32_t slot = -1;
  LoraShape lora;
};

struct InferenceSession : OpenedCheckpoint {
  std::unique_ptr<GenerationEngine> engine;
  std::string model_name;  // the checkpoint's model name and step: "tiny@step_00000010"
  std::vector<LoadedAdapter> adapters;  // in their slots
};

// Collective: open_checkpoint_for, then the engine with its weights and the adapters (each
// checked against the base; the error names its flag and path).
InferenceSession open_inference_session(const InferenceOptions& opts, const std::string& verb);

}  // namespace jumbo
