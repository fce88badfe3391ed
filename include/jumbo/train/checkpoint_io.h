#pragma once
// The trainer's state as checkpoint pieces: for every range of the flat parameter buffer this
// rank's optimizer updates, the master weights and AdamW moments, described by the tensor's
// global shape and slice (ckpt/ knows nothing of models; this is where the two meet).
#include <string>
#include <vector>

#include "jumbo/ckpt/shard.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"
#include "jumbo/model/params.h"
#include "jumbo/train/grad_sync.h"

namespace jumbo {

// One piece per parameter range (adjacent ranges of one parameter merged: data-parallel
// buckets cut parameters), with where its elements start in the flat parameter buffer (`flat`)
// and in the optimizer state (`local`). The last stage's copy of the tied embedding is left
// out when `for_saving` (the first stage saves it) and loaded from the first stage's pieces
// otherwise.
struct StatePiece {
  TensorPiece piece;
  int64_t flat = 0;
  int64_t local = 0;
};
std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, bool for_saving);

// The same pieces pointing into memory: master weights indexed by flat offset, the moments by
// optimizer-state offset.
std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              float* master, float* exp_avg, float* exp_avg_sq,
                                              bool for_saving);

// What a trainer at grid position `at` of a tp x pp x dp layout (balanced stage split) lays
// out, without memory: its parameters' flat offsets and the ranges its optimizer updates.
// Checkpoint conversion and the checkpoint benchmark use it for ranks they never build.
struct RankStateLayout {
  ParamStore params;  // offsets only: never allocated
  std::vector<OptimRange> ranges;
  int64_t state_elems = 0;
};
RankStateLayout rank_state_layout(const ModelConfig& model, int64_t tp, int64_t pp, int64_t dp,
                                  int64_t virtual_stages, bool zero1, int64_t bucket_size,
                                  const GridCoords& at);

// "tp0-pp1-dp0.h5": the shard file of a rank, named by its grid coordinates.
std::string shard_file_name(const GridCoords& at);

}  // namespace jumbo
