#pragma once
// `jumbo ckpt merge --adapter A -o CKPT`: a LoRA checkpoint (its adapters; its base named by
// its init_from, fingerprint checked) merged into a full checkpoint, W += (alpha / r) B A per
// adapted map, written as one tp 1 x pp 1 x dp 1 rank at step 0 (whole_checkpoint.h). Every
// tool that reads a full checkpoint (eval, generate, serve, the exports) then reads the
// fine-tuned model. docs/finetune.md.
#include <cstdint>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct LoraMergeStats {
  std::string adapter, base;  // the checkpoints' step directories (URLs)
  LoraShape lora;
  int64_t merged_maps = 0;    // base weights changed
  int64_t adapter_params = 0;
  int64_t bytes = 0;          // of the shard written
  std::string checkpoint_dir;
};

// Throws UserError (one line) when -o is not new, A is not a LoRA checkpoint, or its base is
// missing or has another fingerprint.
LoraMergeStats merge_lora(const std::string& adapter_path, const std::string& out_root,
                          const S3Options& s3);

// The one rule of a merge, for `ckpt merge` and the exports: W [out, in] += scale * B A with
// A [r, in] and B [b_rows, r], B's row o landing on W's row o, or with `part` (q, k or v of the
// grouped q/k/v map, lora_delta_rows) on the rows of that part.
void add_lora_delta(float* w, int64_t in, const float* a, const float* b, int64_t b_rows,
                    int64_t r, float scale, const ColumnBlocks& part);
ColumnBlocks lora_delta_rows(const ModelConfig& model, LoraTarget target);

}  // namespace jumbo
