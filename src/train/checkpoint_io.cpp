#include "jumbo/train/checkpoint_io.h"

#include <fmt/format.h>


namespace jumbo {

std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, StateUse use) {
  std::vector<StatePiece> out;
  for (const OptimRange& r : ranges) {
    const ParamInfo& info = params.info(r.param);
    if (use == StateUse::save && info.pipeline_copy) continue;
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
                                              MasterMemory master, float* exp_avg,
                                              float* exp_avg_sq, StateUse use) {
  std::vector<PieceData> out;
  for (StatePiece& sp : state_pieces(params, ranges, use)) {
    PieceData pd;
    pd.piece = std::move(sp.piece);
    float* weights = master.base + (master.index == MasterIndex::local ? sp.local : sp.flat);
    pd.state = {weights, exp_avg + sp.local, exp_avg_sq + sp.local};
    out.push_back(std::move(pd));
  }
  return out;
}

std::string shard_file_name(const GridCoords& at) {
  return fmt::format("tp{}-pp{}-dp{}.h5", at.tp_rank, at.pp_rank, at.dp_rank);
}

}  // namespace jumbo
