#pragma once
// The trainer's state as checkpoint pieces: for every range of the flat parameter buffer this
// rank's optimizer updates, the master weights and AdamW moments, described by the tensor's
// global shape and slice (ckpt/ knows nothing of models; this is where the two meet).
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/comm/grid.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/sharding.h"
#include "jumbo/plan/storage.h"  // StateUse, state_pieces, shard_file_name

namespace jumbo {

// Where the master weights are in memory and how they are indexed (train/optimizer.h).
struct MasterMemory {
  float* base = nullptr;
  MasterIndex index = MasterIndex::flat;
};

// The pieces of state_pieces (plan/storage.h) pointing into memory: the master as `master` says, the moments by
// optimizer-state offset.
std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              MasterMemory master, float* exp_avg,
                                              float* exp_avg_sq, StateUse use);

// Collective over `dp`: dp rank 0 loads the master weights of `params` (a stage of any tp x pp
// layout, its shapes from stage_params) from the checkpoint and the replicas receive them;
// then the compute copy is refreshed. Only `master` is read (a null state pointer is skipped).
// For inference, and LoRA's frozen base. Throws UserError naming the file or tensor, on every
// rank of `dp` alike (the replicas would otherwise wait for the broadcast).
void load_weights(const ResolvedCheckpoint& ckpt, ParamStore& params, Backend& backend, Comm& dp);

}  // namespace jumbo
