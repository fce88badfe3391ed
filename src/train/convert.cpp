#include "jumbo/train/convert.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/tools.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/model/stages.h"

namespace jumbo {
namespace {

void check_layout(const TargetLayout& t, const ModelConfig& m) {
  const auto bad = [](const std::string& what) { throw UserError("jumbo ckpt convert: " + what); };
  if (t.tp < 1 || t.pp < 1 || t.dp < 1 || t.virtual_stages < 1) {
    bad(fmt::format("--tp {} --pp {} --dp {} --virtual-stages {}: expected >= 1 each", t.tp, t.pp,
                    t.dp, t.virtual_stages));
  }
  if (m.heads % t.tp != 0 || m.ffn_dim() % t.tp != 0) {
    bad(fmt::format("--tp {} does not divide model.heads = {} and the ffn width {}", t.tp,
                    m.heads, m.ffn_dim()));
  }
  if (m.layers < t.pp * t.virtual_stages ||
      (t.virtual_stages > 1 && m.layers % (t.pp * t.virtual_stages) != 0)) {
    bad(fmt::format("--pp {} x --virtual-stages {} does not fit model.layers = {}", t.pp,
                    t.virtual_stages, m.layers));
  }
  if (t.bucket_size < 1) bad(fmt::format("--bucket-size {}: expected >= 1", t.bucket_size));
}

}  // namespace

ConvertStats convert_checkpoint(const std::string& src, const std::string& dst_root,
                                const TargetLayout& layout, Comm& world, const S3Options& s3) {
  // Every process reads the manifest itself: it is small next to the shards.
  ResolvedCheckpoint in = resolve_checkpoint(src, s3);
  const Manifest& source = in.manifest;
  const ModelConfig& model = source.model;
  check_layout(layout, model);
  std::unique_ptr<Storage> out = open_storage(dst_root, s3);
  const std::string dir = checkpoint_dir_name(source.progress.step);
  const bool zero1 = layout.zero1 && layout.dp > 1;

  ConvertStats stats;
  std::string records;  // this process's file records, one JSON per line
  const int64_t positions = layout.tp * layout.pp * layout.dp;
  for (int64_t rank = world.rank(); rank < positions; rank += world.size()) {
    const GridCoords at = grid_coords(static_cast<int>(rank), static_cast<int>(layout.tp),
                                      static_cast<int>(layout.dp));
    if (!zero1 && at.dp_rank != 0) continue;  // data-parallel replicas write nothing
    const RankStateLayout target =
        rank_state_layout(model, layout.tp, layout.pp, layout.dp, layout.virtual_stages, zero1,
                          layout.bucket_size, at);
    // Buffers for exactly the pieces this target rank saves.
    std::vector<std::vector<float>> buffers;
    std::vector<PieceData> pieces;
    for (StatePiece& sp : state_pieces(target.params, target.ranges, true)) {
      const auto n = static_cast<size_t>(sp.piece.count());
      float* base = buffers.emplace_back(3 * n).data();
      pieces.push_back({std::move(sp.piece), {base, base + n, base + 2 * n}});
    }
    load_checkpoint_pieces(*in.storage, in.dir, source, pieces);
    const std::vector<char> image = build_shard_image(
        pieces, {{"step", source.progress.step}, {"format_version", kCheckpointFormatVersion}});
    const std::string name = shard_file_name(at);
    out->write(join_dir(dir, name), image.data(), image.size());
    std::vector<TensorPiece> described;
    for (const PieceData& pd : pieces) described.push_back(pd.piece);
    records += shard_record_to_json({name, static_cast<int64_t>(image.size()), file_crc32(image)},
                                    described) + "\n";
    ++stats.files;
    stats.bytes += static_cast<int64_t>(image.size());
  }
  const std::vector<std::vector<char>> all =
      world.gather_bytes(std::vector<char>(records.begin(), records.end()), 0);
  if (world.rank() == 0) {
    Manifest m = source;  // the same progress and model, the target's layout and files
    m.files.clear();
    m.tensors.clear();
    m.layout = {layout.tp, layout.pp, layout.dp, zero1, layout.virtual_stages,
                stage_layer_range(model, layout.pp, 0, layout.virtual_stages, {}).per_stage,
                source.layout.precision};
    write_manifest(*out, dir, std::move(m), all);
  }
  world.barrier();
  return stats;
}

}  // namespace jumbo
