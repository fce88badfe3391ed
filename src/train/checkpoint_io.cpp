#include "jumbo/train/checkpoint_io.h"

#include <fmt/format.h>

namespace jumbo {

std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              Tensor exp_avg, Tensor exp_avg_sq, bool for_saving) {
  std::vector<PieceData> out;
  float* master = params.all_master().as<float>();
  float* m = exp_avg.as<float>();
  float* v = exp_avg_sq.as<float>();
  for (const OptimRange& r : ranges) {
    const ParamInfo& info = params.info(r.param);
    if (for_saving && info.pipeline_copy) continue;
    const int64_t begin = r.flat - info.flat_offset;
    // Data-parallel buckets cut parameters; without ZeRO-1 the pieces of one rank join up.
    if (!out.empty() && out.back().piece.name == info.name &&
        out.back().piece.flat_end == begin &&
        out.back().state[1] + out.back().piece.count() == m + r.local) {
      out.back().piece.flat_end += r.count;
      continue;
    }
    PieceData pd;
    pd.piece.name = info.name;
    pd.piece.global_shape = info.slice.global_shape;
    pd.piece.offset = info.slice.offset;
    pd.piece.shape = info.slice.shape;
    pd.piece.flat_begin = begin;
    pd.piece.flat_end = begin + r.count;
    pd.piece.valid_rows = info.valid_rows;
    pd.state = {master + r.flat, m + r.local, v + r.local};
    out.push_back(std::move(pd));
  }
  return out;
}

std::string shard_file_name(int tp_rank, int pp_rank, int dp_rank) {
  return fmt::format("tp{}-pp{}-dp{}.h5", tp_rank, pp_rank, dp_rank);
}

}  // namespace jumbo
