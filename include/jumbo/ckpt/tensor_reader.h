#pragma once
// Whole tensors of a checkpoint, one at a time, gathered from its pieces in any layout (tp, pp,
// the distributed optimizer's ranges): for the offline tools (the Hugging Face export) whose
// memory must stay at a few tensors, not the model. Local shard files are opened in place and
// their size and CRC-32 checked by a streaming pass when first opened; S3 shard files are read
// whole (and kept) as the other tools read them. One process, no MPI.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/ckpt/storage.h"

namespace jumbo {

class CheckpointTensorReader {
 public:
  CheckpointTensorReader(Storage& storage, std::string dir, const Manifest& manifest);
  ~CheckpointTensorReader();
  // The master elements of tensor `name` in its first shape[0] rows (its real shape: the
  // stored one, or fewer rows of a padded vocabulary), row-major. Throws UserError naming the
  // manifest when the tensor is missing or its pieces do not cover it.
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape);

 private:
  ShardReader& reader(int file);

  Storage& storage_;
  std::string dir_;
  const Manifest& manifest_;
  std::map<int, std::vector<char>> images_;  // S3 files, read whole
  std::map<int, std::unique_ptr<ShardReader>> readers_;
};

}  // namespace jumbo
