#pragma once
// The trainer's state as checkpoint pieces: for every range of the flat parameter buffer this
// rank's optimizer updates, the master weights and AdamW moments, described by the tensor's
// global shape and slice (ckpt/ knows nothing of models; this is where the two meet).
#include <string>
#include <vector>

#include "jumbo/ckpt/shard.h"
#include "jumbo/comm/grid.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/sharding.h"

namespace jumbo {

// Pieces to save, or to load into: the last stage's copy of the tied embedding is not saved
// (the first stage saves it) but is loaded, from the first stage's pieces.
enum class StateUse { save, load };

// One piece per parameter range (adjacent ranges of one parameter merged: data-parallel
// buckets cut parameters), with where its elements start in the flat parameter buffer (`flat`)
// and in the optimizer state (`local`).
struct StatePiece {
  TensorPiece piece;
  int64_t flat = 0;
  int64_t local = 0;
};
std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, StateUse use);

// Where the master weights are in memory and how they are indexed (train/optimizer.h).
struct MasterMemory {
  float* base = nullptr;
  MasterIndex index = MasterIndex::flat;
};

// The same pieces pointing into memory: the master as `master` says, the moments by
// optimizer-state offset.
std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              MasterMemory master, float* exp_avg,
                                              float* exp_avg_sq, StateUse use);

// "tp0-pp1-dp0.h5": the shard file of a rank, named by its grid coordinates.
std::string shard_file_name(const GridCoords& at);

}  // namespace jumbo
