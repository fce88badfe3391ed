#pragma once
// Offline checkpoint tools (`jumbo ckpt ...`): find a checkpoint, describe and verify it, and
// export its weights for use outside jumbo. One process, no MPI. See docs/checkpoint-format.md.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// One tensor of a safetensors export, made from one checkpoint tensor by a rearrangement that
// knows no model (the caller decides names and layouts, see infer/export_hf.h). The source is
// taken in its real shape (checkpoint_tensor_shape; a 1-d tensor is one column): its row r
// becomes row row_order[r] (empty: r, else a permutation of the rows), and with `transpose`
// the result is stored transposed ([rows, cols] written as [cols, rows]; 2-d sources only).
struct SafetensorsTensor {
  std::string name;    // in the output file
  std::string source;  // the checkpoint tensor
  std::vector<int64_t> row_order;
  bool transpose = false;
};
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;  // in file order

// A tensor's real shape: the global shape, but "embedding.word" keeps only its model.vocab
// rows (the rest pads the vocabulary). Throws UserError when the checkpoint lacks the tensor.
std::vector<int64_t> checkpoint_tensor_shape(const Manifest& manifest, const std::string& name);

// What an export records about its checkpoint: format "pt", producer, source URL, progress,
// dtype and the model's fields (docs/checkpoint-format.md, "safetensors export").
SafetensorsMetadata checkpoint_metadata(const Storage& storage, const std::string& dir,
                                        const Manifest& manifest, const std::string& dtype);

// The one safetensors writer: `tensors` in file order, the master weights of their sources
// rearranged as each says; checkpoint tensors not listed are left out. `dtype` is "f32" or
// "bf16" (round to nearest even). Streams: the header first, then each shard file is read
// once and its pieces' elements stored at their places in the memory-mapped output, so memory
// stays at one shard file plus one piece (and the output's page cache). Written to
// out_path + ".tmp", then renamed. Throws UserError on any problem with the checkpoint or the
// output, std::logic_error on a bad `tensors` list (a source named twice, not a permutation).
ExportStats write_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                              const std::string& out_path, const std::string& dtype,
                              const std::vector<SafetensorsTensor>& tensors,
                              const SafetensorsMetadata& metadata);

// Every checkpoint tensor under its jumbo name ("layers.3.attn.qkv.weight"), in model order,
// as stored ("embedding.word" by its real rows), with checkpoint_metadata: write_safetensors
// with nothing rearranged.
ExportStats export_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                               const std::string& out_path, const std::string& dtype);

}  // namespace jumbo
