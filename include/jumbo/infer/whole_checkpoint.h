#pragma once
// A checkpoint written offline as one tp 1 x pp 1 x dp 1 rank saves it: one HDF5 shard (the
// master weights, zero Adam moments), then the manifest. For `jumbo ckpt import` and
// `jumbo ckpt merge`, through ckpt's own writers (the shard image, the manifest).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/manifest.h"

namespace jumbo {

// -o must be a local directory that is missing or empty, so the written checkpoint never
// mixes with another run's. Returns whether it exists. Throws UserError naming -o.
bool check_new_checkpoint_root(const std::string& root);

// Fills a piece's master elements (piece.count() floats, row-major within its range).
using MasterFill = std::function<void(const TensorPiece& piece, float* master)>;

// Writes root/step_00000000 from `pieces`, each piece's master asked of `fill` in turn and
// written straight to the shard file (ckpt/shard.h's ShardFileWriter: memory holds one
// piece, not the model; the moments are zero), the extra files (name, bytes) beside it, then
// the manifest of `header` and `latest`. On a failure nothing is left at root (a directory
// this created is removed). Returns the shard file's bytes.
int64_t write_whole_checkpoint(const std::string& root, bool root_existed,
                               const std::vector<TensorPiece>& pieces, const MasterFill& fill,
                               Manifest header,
                               const std::vector<std::pair<std::string, std::vector<char>>>& files);

}  // namespace jumbo
