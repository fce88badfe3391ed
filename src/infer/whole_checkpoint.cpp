#include "jumbo/infer/whole_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "jumbo/ckpt/storage.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/storage.h"

namespace jumbo {

namespace fs = std::filesystem;

bool check_new_checkpoint_root(const std::string& root) {
  if (root.empty() || is_s3_url(root)) {
    throw UserError(fmt::format("-o {}: expected a local directory (the checkpoint root to "
                                "create)", root));
  }
  std::error_code ec;
  if (!fs::exists(root, ec)) return false;
  if (!fs::is_directory(root, ec)) {
    throw UserError(fmt::format("-o {}: exists and is not a directory; expected a new "
                                "checkpoint root", root));
  }
  if (!fs::is_empty(root, ec)) {
    throw UserError(fmt::format("-o {}: is not empty; expected a new (or empty) checkpoint "
                                "root, so the new checkpoint cannot mix with others", root));
  }
  return true;
}

int64_t write_whole_checkpoint(const std::string& root, bool root_existed,
                               const std::vector<TensorPiece>& pieces, const MasterFill& fill,
                               Manifest header,
                               const std::vector<std::pair<std::string, std::vector<char>>>& files) {
  int64_t largest = 0;
  for (const TensorPiece& p : pieces) largest = std::max(largest, p.count());
  const std::string dir = checkpoint_dir_name(0);
  std::error_code ec;
  fs::create_directories(fs::path(root) / dir, ec);
  if (ec) throw UserError(fmt::format("-o {}: cannot create the directory ({})", root, ec.message()));
  try {
    const std::unique_ptr<Storage> out = open_file_storage(root);
    const std::string shard = shard_file_name(GridCoords{});
    const fs::path shard_path = fs::path(root) / dir / shard;
    const std::string tmp = shard_path.string() + ".tmp";
    {
      std::vector<float> master(static_cast<size_t>(largest));  // one piece at a time
      ShardFileWriter writer(tmp, {{"step", 0}, {"format_version", kCheckpointFormatVersion}});
      for (const TensorPiece& p : pieces) {
        fill(p, master.data());
        writer.add_piece_with_zero_moments(p, master.data());
      }
      writer.close();
    }
    int64_t bytes = 0;
    const uint32_t crc = local_file_crc32(tmp, bytes);
    fs::rename(tmp, shard_path, ec);
    if (ec) throw UserError(fmt::format("{}: cannot rename into place ({})", tmp, ec.message()));
    const std::string record = shard_record_to_json({shard, bytes, crc}, pieces) + "\n";
    for (const auto& [name, bytes] : files) out->write(name, bytes.data(), bytes.size());
    header.layout = Layout{};
    header.layout.stage_layers = stage_layer_range(header.model, header.layout, 0).per_stage;
    write_manifest(*out, dir, std::move(header), {std::vector<char>(record.begin(), record.end())});
    return bytes;
  } catch (...) {
    if (root_existed) {  // it was empty: everything in it is this checkpoint's
      std::vector<fs::path> written;
      for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) written.push_back(e.path());
      for (const fs::path& p : written) fs::remove_all(p, ec);
    } else {
      fs::remove_all(root, ec);
    }
    throw;
  }
}

}  // namespace jumbo
