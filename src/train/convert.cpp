#include "jumbo/train/convert.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/tools.h"
#include "jumbo/model/gpt.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"
#include "jumbo/train/stages.h"

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
    // Grid order as in training: tp fastest, then dp, then pp.
    const int64_t t = rank % layout.tp, d = (rank / layout.tp) % layout.dp,
                  p = rank / (layout.tp * layout.dp);
    if (!zero1 && d != 0) continue;  // data-parallel replicas write nothing
    const StageLayers layers = stage_layer_range(model, layout.pp, p, layout.virtual_stages, {});
    GptOptions opts;
    opts.first_layer = layers.first_layer;
    opts.num_layers = layers.num_layers;
    opts.chunks = layers.chunks;
    opts.chunk_stride = layers.chunk_stride;
    opts.has_embedding = p == 0;
    opts.has_head = p == layout.pp - 1;
    ParamStore params;  // offsets only: nothing allocated
    for (ParamInfo& info : gpt_stage_params(model, opts, t, layout.tp)) params.add(std::move(info));
    params.pad_to(layout.dp);
    int64_t state_elems = 0;
    const std::vector<OptimRange> ranges =
        optimizer_ranges(params, dp_buckets(params.total_numel(), layout.dp, layout.bucket_size),
                         layout.dp, d, zero1, &state_elems);
    // Buffers for exactly the pieces this target rank saves.
    std::vector<std::vector<float>> buffers;
    std::vector<PieceData> pieces;
    for (const OptimRange& r : ranges) {
      const ParamInfo& info = params.info(r.param);
      if (info.pipeline_copy) continue;
      PieceData pd;
      pd.piece = {info.name, info.slice.global_shape, info.slice.offset, info.slice.shape,
                  r.flat - info.flat_offset, r.flat - info.flat_offset + r.count, info.valid_rows};
      if (!pieces.empty() && pieces.back().piece.name == pd.piece.name &&
          pieces.back().piece.flat_end == pd.piece.flat_begin) {
        pieces.back().piece.flat_end = pd.piece.flat_end;  // buckets cut it; one piece on disk
        continue;
      }
      pieces.push_back(pd);
    }
    for (PieceData& pd : pieces) {
      buffers.emplace_back(static_cast<size_t>(pd.piece.count()) * 3);
      float* base = buffers.back().data();
      pd.state = {base, base + pd.piece.count(), base + 2 * pd.piece.count()};
    }
    load_checkpoint_pieces(*in.storage, in.dir, source, pieces);
    const std::vector<char> image = build_shard_image(
        pieces, {{"step", source.progress.step}, {"format_version", kCheckpointFormatVersion}});
    const std::string name = shard_file_name(static_cast<int>(t), static_cast<int>(p),
                                             static_cast<int>(d));
    out->write(dir + "/" + name, image.data(), image.size());
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
    Manifest m = source;
    m.files.clear();
    m.tensors.clear();
    m.layout = {layout.tp, layout.pp, layout.dp, zero1, layout.virtual_stages,
                stage_layer_range(model, layout.pp, 0, layout.virtual_stages, {}).per_stage,
                source.layout.precision};
    for (const std::vector<char>& lines : all) {
      std::string line;
      for (char c : lines) {
        if (c != '\n') {
          line += c;
          continue;
        }
        add_shard_record(m, line);
        line.clear();
      }
    }
    const std::string text = manifest_to_json(m);
    out->write(dir + "/manifest.json", text.data(), text.size());
    const std::string latest = dir + "\n";
    out->write("latest", latest.data(), latest.size());
  }
  world.barrier();
  return stats;
}

}  // namespace jumbo
