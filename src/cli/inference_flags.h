#pragma once
// The flags every verb that runs a trained checkpoint shares: add_checkpoint_flags (eval,
// generate, serve) and, for the generation engine, add_inference_flags (generate, serve).
#include <CLI/CLI.hpp>

#include "jumbo/infer/session.h"
#include "flags.h"

namespace jumbo::cli {

inline void add_checkpoint_flags(CLI::App& cmd, CheckpointOptions& o) {
  cmd.add_option("--checkpoint", o.checkpoint,
                 "checkpoint directory, or a root holding `latest` (local or s3://)")
      ->required();
  cmd.add_option("--tokenizer", o.tokenizer,
                 "SentencePiece model (default: the checkpoint's data.tokenizer)");
  cmd.add_option("--tp", o.tp, "tensor-parallel ranks (any layout, whatever the checkpoint's)")
      ->capture_default_str();
  cmd.add_option("--pp", o.pp, "pipeline stages")->capture_default_str();
  add_choice_flag(cmd, "--device", o.device, "cpu or cuda (one GPU per rank)");
  add_choice_flag(cmd, "--precision", o.precision,
                  "fp32 or bf16 weights and activations (default: the checkpoint's)");
  add_choice_flag(cmd, "--comm-emulate", o.comm_emulate,
                  "nccl: MPI held to NCCL's rules on CPU ranks (the config's comm.emulate)");
}

inline void add_inference_flags(CLI::App& cmd, InferenceOptions& o) {
  add_checkpoint_flags(cmd, o);
  cmd.add_option("--max-batch", o.max_batch,
                 "sequences decoded together: the KV cache's slots")->capture_default_str();
  cmd.add_option("--prefill-chunk", o.prefill_chunk,
                 "prompt tokens one step may add (longer prompts take several steps)")
      ->capture_default_str();
}

}  // namespace jumbo::cli
