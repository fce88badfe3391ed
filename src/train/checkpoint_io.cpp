#include "jumbo/train/checkpoint_io.h"

#include <fmt/format.h>

#include <optional>
#include <string>

#include "jumbo/ckpt/checkpointer.h"


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

void load_weights(const ResolvedCheckpoint& ckpt, ParamStore& params, Backend& backend, Comm& dp) {
  std::string error;
  if (dp.rank() == 0) try {
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
  } catch (const UserError& e) {
    error = e.what();
  }
  // The replicas wait for the broadcast: a read that failed on dp rank 0 fails them too.
  if (dp.size() > 1) {
    if (const std::optional<std::string> failed = first_error(dp, error)) {
      throw UserError(error.empty() ? *failed : error);
    }
    dp.broadcast(params.all_weights(), 0);
  } else if (!error.empty()) {
    throw UserError(error);
  }
}

}  // namespace jumbo
