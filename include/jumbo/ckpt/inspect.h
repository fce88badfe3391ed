#pragma once
// `jumbo ckpt inspect [--verify]`: a human report of a checkpoint, and with verification every
// shard file read whole and checked against the manifest. One process, no MPI.
#include <string>
#include <utility>

#include "jumbo/ckpt/resolve.h"
#include "jumbo/ckpt/tensor_listing.h"
#include "jumbo/config/config.h"

namespace jumbo {

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
// The tensors are listed as `listing` orders them, with their real shapes.
std::string inspect_checkpoint(const ResolvedCheckpoint& ckpt, bool verify,
                               const TensorListing& listing);

}  // namespace jumbo
