#include "jumbo/train/reshard.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/train/checkpoint_io.h"

namespace jumbo {
ReshardStats reshard_checkpoint(const std::string& src, const std::string& dst_root,
                                const Layout& layout, Comm& world, const S3Options& s3) {
  // Every process reads the manifest itself: it is small next to the shards.
  ResolvedCheckpoint in = resolve_checkpoint(src, s3);
  const Manifest& source = in.manifest;
  const ModelConfig& model = source.model;
  validate_layout(layout, model, "jumbo ckpt convert", LayoutKeys::flags);
  std::unique_ptr<Storage> out = open_storage(dst_root, s3);
  const std::string dir = checkpoint_dir_name(source.progress.step);

  ReshardStats stats;
  std::string records;  // this process's file records, one JSON per line
  const int64_t positions = layout.tp * layout.pp * layout.dp;
  for (int64_t rank = world.rank(); rank < positions; rank += world.size()) {
    const GridCoords at = grid_coords(static_cast<int>(rank), static_cast<int>(layout.tp),
                                      static_cast<int>(layout.dp));
    if (!layout.zero1_active() && at.dp_rank != 0) continue;  // dp replicas write nothing
    const StagePlan target = plan_stage(model, layout, StepShape{}, at);
    // Buffers for exactly the pieces this target rank saves.
    std::vector<std::vector<float>> buffers;
    std::vector<PieceData> pieces;
    for (StatePiece& sp : state_pieces(target.params, target.optimizer_ranges, StateUse::save)) {
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
    m.layout = layout;
    m.layout.stage_layers = stage_layer_range(model, layout, 0).per_stage;
    write_manifest(*out, dir, std::move(m), all);
  }
  world.barrier();
  return stats;
}

}  // namespace jumbo
