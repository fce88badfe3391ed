#include "jumbo/infer/checkpoint_weights.h"

#include "jumbo/model/checkpoint_names.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/train/checkpoint_io.h"

namespace jumbo {

ResolvedCheckpoint open_checkpoint(const std::string& path, const S3Options& s3, Comm& world) {
  // Rank 0's answer: "ok\n<step directory url>\n<manifest>" or "error\n<message>".
  std::string message;
  ResolvedCheckpoint out;
  if (world.rank() == 0) {
    try {
      out = resolve_checkpoint(path, s3);
      message = "ok\n" + out.storage->url(out.dir) + "\n" + manifest_to_json(out.manifest);
    } catch (const UserError& e) {
      message = std::string("error\n") + e.what();
    }
  }
  std::vector<char> bytes(message.begin(), message.end());
  world.broadcast_bytes(bytes, 0);
  const std::string text(bytes.begin(), bytes.end());
  const size_t first = text.find('\n');
  if (text.compare(0, first, "ok") != 0) throw UserError(text.substr(first + 1));
  if (world.rank() == 0) return out;
  const size_t second = text.find('\n', first + 1);
  const std::string dir_url = text.substr(first + 1, second - first - 1);
  const StoragePath where = split_storage_path(dir_url);
  out.storage = open_storage(where.parent, s3);
  out.dir = where.name;
  out.manifest = parse_manifest(text.substr(second + 1), dir_url + "/manifest.json");
  return out;
}

void load_weights(const ResolvedCheckpoint& ckpt, ParamStore& params, Backend& backend, Comm& dp) {
  if (dp.rank() == 0) {
    // One range per parameter: the whole slice this rank holds.
    std::vector<OptimRange> ranges;
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params.info(static_cast<int>(i));
      ranges.push_back({p.flat_offset, 0, p.numel(), static_cast<int>(i)});
    }
    // The checkpoint holds the f32 master: read in place into f32 host weights, else into a
    // host copy that is rounded to the compute dtype and uploaded.
    const Tensor weights = params.all_weights();
    const bool direct = weights.device == Device::cpu && weights.dtype == DType::f32;
    std::vector<float> staged;
    float* host = direct ? weights.as<float>() : nullptr;
    if (!host) {
      staged.assign(static_cast<size_t>(weights.numel()), 0.0f);
      host = staged.data();
    }
    std::vector<PieceData> pieces;
    for (const StatePiece& sp : state_pieces(params, ranges, StateUse::load)) {
      PieceData pd;
      pd.piece = sp.piece;
      pd.state = {host + sp.flat, nullptr, nullptr};  // the weights, not Adam's moments
      pieces.push_back(std::move(pd));
    }
    load_checkpoint_pieces(*ckpt.storage, ckpt.dir, ckpt.manifest, pieces);
    if (!direct) write_from_f32(backend, weights, staged.data());
  }
  if (dp.size() > 1) dp.broadcast(params.all_weights(), 0);
}

TensorListing gpt_tensor_listing() { return {gpt_tensor_before, gpt_tensor_real_shape}; }

}  // namespace jumbo
