#pragma once
// Offline checkpoint tools (`jumbo ckpt ...`): find a checkpoint, describe and verify it, and
// export its weights for use outside jumbo. One process, no MPI. See docs/checkpoint-format.md.
#include <cstdint>
#include <memory>
#include <string>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct ResolvedCheckpoint {
  std::unique_ptr<Storage> storage;  // rooted at the parent of the step directory
  std::string dir;                   // the step directory's name: "step_00001200"
  Manifest manifest;
};

// `path` is one checkpoint directory (it holds manifest.json) or a checkpoint root (its
// `latest` file names the newest step directory); a local path or "s3://bucket/prefix/...".
// Throws UserError (one line) when it is neither.
ResolvedCheckpoint resolve_checkpoint(const std::string& path, const S3Options& s3);

// Thrown by inspect_checkpoint when verification finds bad files: what() is one line naming
// them; `report` is the whole report, with one line per bad file.
struct CheckpointVerifyError : UserError {
  CheckpointVerifyError(const std::string& what, std::string report)
      : UserError(what), report(std::move(report)) {}
  std::string report;
};

// A human report: progress, model, layout, files and a table of tensors. With `verify`, every
// shard file is read and its size and CRC-32 (and the pieces it holds) checked against the
// manifest.
std::string inspect_checkpoint(const ResolvedCheckpoint& ckpt, bool verify);

struct ExportStats {
  int64_t tensors = 0;
  int64_t parameters = 0;
  int64_t bytes = 0;  // of the output file
};

// Writes the master weights of the checkpoint as ONE safetensors file of full tensors named as
// in jumbo ("layers.3.attn.qkv.weight"); "embedding.word" keeps only its model.vocab real rows.
// `dtype` is "f32" or "bf16" (round to nearest even). Streams: the header first, then each
// shard file is read once and its pieces written in place, so memory stays at one shard file
// plus one piece. Written to out_path + ".tmp", then renamed. Throws UserError on any problem.
ExportStats export_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                               const std::string& out_path, const std::string& dtype);

}  // namespace jumbo
