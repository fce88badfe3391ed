#include "jumbo/train/checkpoint_io.h"

#include <fmt/format.h>


namespace jumbo {

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

}  // namespace jumbo
