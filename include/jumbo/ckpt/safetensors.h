#pragma once
// Exports of a checkpoint's weights as safetensors (`jumbo ckpt export`, and the file of the
// Hugging Face export, infer/export_hf.h). ckpt writes the file without knowing the model:
// the caller names the tensors, their real shapes and rearrangements. One process, no MPI.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/ckpt/tensor_listing.h"

namespace jumbo {

struct ExportStats {
  int64_t tensors = 0;
  int64_t parameters = 0;
  int64_t bytes = 0;  // of the output file
};

// One tensor of a safetensors export, made from one checkpoint tensor by a rearrangement that
// knows no model (the caller decides names and layouts, see infer/export_hf.h). The source is
// taken in its real shape (`shape`: the stored one, or fewer rows; a 1-d tensor is one column): its row r
// becomes row row_order[r] (empty: r, else a permutation of the rows), and with `transpose`
// the result is stored transposed ([rows, cols] written as [cols, rows]; 2-d sources only).
struct SafetensorsTensor {
  std::string name;            // in the output file
  std::string source;          // the checkpoint tensor
  std::vector<int64_t> shape;  // its real shape (checkpoint_tensor_shape)
  std::vector<int64_t> row_order;
  bool transpose = false;
};
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;  // in file order

// A tensor's real shape, as `listing` says (its global shape, or fewer rows: a padded
// vocabulary). Throws UserError when the checkpoint lacks the tensor.
std::vector<int64_t> checkpoint_tensor_shape(const Manifest& manifest, const std::string& name,
                                             const TensorListing& listing);

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

// Every checkpoint tensor under its jumbo name ("layers.3.attn.qkv.weight"), in `listing`'s
// order, by its real shape, with checkpoint_metadata: write_safetensors with nothing
// rearranged.
ExportStats export_safetensors(Storage& storage, const std::string& dir, const Manifest& manifest,
                               const std::string& out_path, const std::string& dtype,
                               const TensorListing& listing);

}  // namespace jumbo
