#include "jumbo/train/checkpoint_io.h"

#include <fmt/format.h>

#include "jumbo/model/gpt.h"
#include "jumbo/model/stages.h"

namespace jumbo {

std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, bool for_saving) {
  std::vector<StatePiece> out;
  for (const OptimRange& r : ranges) {
    const ParamInfo& info = params.info(r.param);
    if (for_saving && info.pipeline_copy) continue;
    const int64_t begin = r.flat - info.flat_offset;
    if (!out.empty()) {
      StatePiece& last = out.back();
      if (last.piece.name == info.name && last.piece.flat_end == begin &&
          last.local + last.piece.count() == r.local) {
        last.piece.flat_end += r.count;
        continue;
      }
    }
    StatePiece sp;
    sp.piece = {info.name,  info.slice.global_shape, info.slice.offset, info.slice.shape,
                begin,      begin + r.count,         info.valid_rows};
    sp.flat = r.flat;
    sp.local = r.local;
    out.push_back(std::move(sp));
  }
  return out;
}

std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              float* master, float* exp_avg, float* exp_avg_sq,
                                              bool for_saving) {
  std::vector<PieceData> out;
  for (StatePiece& sp : state_pieces(params, ranges, for_saving)) {
    PieceData pd;
    pd.piece = std::move(sp.piece);
    pd.state = {master + sp.flat, exp_avg + sp.local, exp_avg_sq + sp.local};
    out.push_back(std::move(pd));
  }
  return out;
}

RankStateLayout rank_state_layout(const ModelConfig& model, int64_t tp, int64_t pp, int64_t dp,
                                  int64_t virtual_stages, bool zero1, int64_t bucket_size,
                                  const GridCoords& at) {
  const StageLayers layers = stage_layer_range(model, pp, at.pp_rank, virtual_stages, {});
  GptOptions opts;
  opts.first_layer = layers.first_layer;
  opts.num_layers = layers.num_layers;
  opts.chunks = layers.chunks;
  opts.chunk_stride = layers.chunk_stride;
  opts.has_embedding = at.pp_rank == 0;
  opts.has_head = at.pp_rank == pp - 1;
  RankStateLayout out;
  for (ParamInfo& info : gpt_stage_params(model, opts, at.tp_rank, tp)) {
    out.params.add(std::move(info));
  }
  out.params.pad_to(dp);  // as the trainer pads for data-parallel shards
  out.ranges = optimizer_ranges(out.params, dp_buckets(out.params.total_numel(), dp, bucket_size),
                                dp, at.dp_rank, zero1 && dp > 1, &out.state_elems);
  return out;
}

std::string shard_file_name(const GridCoords& at) {
  return fmt::format("tp{}-pp{}-dp{}.h5", at.tp_rank, at.pp_rank, at.dp_rank);
}

}  // namespace jumbo
