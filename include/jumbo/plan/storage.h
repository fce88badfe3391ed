#pragma once
// Storage of a run (docs/plan.md "Storage"): what each writing rank of a layout saves in a
// checkpoint (its optimizer ranges as pieces), the bytes of one checkpoint, how many coexist at
// the peak of a save under the retention settings, the data, and the file-system throughput a
// save needs. `jumbo plan` prints it; `jumbo train` checks the checkpoint directory's free
// space against the same bytes. The format itself is docs/checkpoint-format.md.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/ckpt/shard.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/sharding.h"

namespace jumbo {

// Pieces to save, or to load into: the last stage's copy of the tied embedding is not saved
// (the first stage saves it) but is loaded, from the first stage's pieces.
enum class StateUse { save, load };

// One piece per parameter range (adjacent ranges of one parameter merged: data-parallel
// buckets cut parameters), with where its elements start in the flat parameter buffer (`flat`)
// and in the optimizer state (`local`).
struct StatePiece {
  TensorPiece piece;
  int64_t flat = 0;
  int64_t local = 0;
};
std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, StateUse use);

// "tp0-pp1-dp0.h5": the shard file of a rank, named by its grid coordinates.
std::string shard_file_name(const GridCoords& at);

// One checkpoint of a layout: the shard files its writers save (dp rank 0 of every tp x pp
// position, or every rank with ZeRO-1) and the manifest.
struct CheckpointSize {
  int64_t files = 0;
  int64_t shard_bytes = 0;     // all shard files (shard_file_bytes of each writer's pieces)
  int64_t largest_file = 0;
  int64_t manifest_bytes = 0;  // manifest.json, serialized as a save writes it
  int64_t total() const { return shard_bytes + manifest_bytes; }
};
// `layout` valid for `model` with dp set (validate_layout). With `lora`, a LoRA run's: the
// adapters and their state alone.
CheckpointSize checkpoint_size(const ModelConfig& model, const Layout& layout,
                               const LoraShape& lora = {});

// Saves of a run of `steps` steps (every checkpoint.every steps and at the last) and the
// checkpoints on the file system at the peak of its last save, the fullest moment: the one
// being written, the newest keep_last - 1 before it, and every keep_every multiple saved so far
// (retention runs after a save, so the oldest of keep_last is still there while it is written).
struct RetentionPeak {
  int64_t steps = 0;  // 0: unknown
  int64_t saves = 0;
  int64_t keep_every_kept = 0;  // keep_every checkpoints that exist by the end
  int64_t at_peak = 0;
};
RetentionPeak checkpoints_at_peak(const CheckpointConfig& c, int64_t steps);

// The bytes of the files of a data mixture's datasets (PREFIX.* of every prefix), or nullopt
// when one is missing or unreadable.
std::optional<int64_t> data_files_bytes(const DataMixture& mixture);

// What `jumbo plan` prints about storage, for one layout.
struct StoragePlan {
  CheckpointSize checkpoint;
  RetentionPeak retention;
  std::optional<int64_t> data_bytes;  // nullopt: unknown, for the reason in data_unknown_why
  std::string data_unknown_why;
  double save_target_s = 600;
  std::optional<int64_t> fs_capacity;  // bytes; nullopt: not given
  int64_t peak_bytes() const {
    return retention.at_peak * checkpoint.total() + data_bytes.value_or(0);
  }
  int64_t save_bytes_per_s() const {
    return static_cast<int64_t>(static_cast<double>(checkpoint.total()) / save_target_s + 0.999);
  }
};
// The human lines (each starting "storage: "); `source_note` says where the checkpoint
// settings came from.
std::string format_storage(const StoragePlan& s, const Layout& layout, const std::string& source_note);
// The machine form for parallelcluster/render.sh: exactly
// checkpoint_bytes=, checkpoints_at_peak=, data_bytes=, peak_bytes=, save_bytes_per_s= (integers;
// data_bytes=0 when unknown), one per line.
std::string format_storage_keys(const StoragePlan& s);

}  // namespace jumbo
