// A checkpoint's tensors one at a time (ckpt/tensor_reader.h).
#include "jumbo/ckpt/tensor_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <utility>

#include "jumbo/config/config.h"

namespace jumbo {

CheckpointTensorReader::CheckpointTensorReader(Storage& storage, std::string dir,
                                               const Manifest& manifest)
    : storage_(storage), dir_(std::move(dir)), manifest_(manifest) {}

CheckpointTensorReader::~CheckpointTensorReader() = default;

ShardReader& CheckpointTensorReader::reader(int file) {
  if (const auto it = readers_.find(file); it != readers_.end()) return *it->second;
  const ShardFileInfo& f = manifest_.files.at(static_cast<size_t>(file));
  const std::string key = join_dir(dir_, f.name);
  const std::string url = storage_.url(key);
  if (const std::optional<std::string> path = storage_.local_path(key)) {
    int64_t bytes = 0;
    const uint32_t crc = local_file_crc32(*path, bytes);  // UserError when missing
    if (bytes != f.bytes) {
      throw UserError(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)",
                                  url, bytes, f.bytes));
    }
    if (crc != f.crc32) {
      throw UserError(fmt::format("{}: CRC-32 {:08x}, the manifest says {:08x} (the file is "
                                  "corrupt)", url, crc, f.crc32));
    }
    return *readers_.emplace(file, std::make_unique<ShardReader>(ShardReader::LocalFile{*path}, url))
                .first->second;
  }
  std::string why;
  std::optional<std::vector<char>> image = read_verified_shard_file(storage_, dir_, f, why);
  if (!image) throw UserError(why);
  const std::vector<char>& kept = images_.emplace(file, std::move(*image)).first->second;
  return *readers_.emplace(file, std::make_unique<ShardReader>(kept, url)).first->second;
}

std::vector<float> CheckpointTensorReader::read(const std::string& name,
                                                const std::vector<int64_t>& shape) {
  const std::string where = storage_.url(join_dir(dir_, "manifest.json"));
  const auto it = manifest_.tensors.find(name);
  if (it == manifest_.tensors.end() || it->second.empty()) {
    throw UserError(fmt::format("{}: the checkpoint has no tensor {}", where, name));
  }
  TensorPiece whole;  // the real rows, as a piece of the stored tensor
  whole.name = name;
  whole.global_shape = it->second.front().piece.global_shape;
  whole.offset.assign(shape.size(), 0);
  whole.shape = shape;
  whole.flat_end = shape_numel(shape);
  std::vector<float> out(static_cast<size_t>(whole.flat_end));
  std::vector<char> hit(out.size(), 0);  // replicated pieces (norms over tp) overlap
  int64_t covered = 0;
  for (const StoredPiece& sp : it->second) {
    const std::vector<OverlapRun> runs = piece_overlap(sp.piece, whole);
    if (runs.empty()) continue;  // only padding rows
    reader(sp.file).copy_overlap(sp.piece, 0, whole, out.data());
    for (const OverlapRun& r : runs) {
      for (int64_t e = r.b; e < r.b + r.length; ++e) {
        covered += !hit[static_cast<size_t>(e)];
        hit[static_cast<size_t>(e)] = 1;
      }
    }
  }
  if (covered != whole.flat_end) {
    throw UserError(fmt::format("{}: tensor {}: the shards hold {} of its {} elements (the "
                                "manifest is incomplete)", where, name, covered, whole.flat_end));
  }
  return out;
}

}  // namespace jumbo
