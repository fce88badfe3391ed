#pragma once
// The trainer's state as checkpoint pieces: for every range of the flat parameter buffer this
// rank's optimizer updates, the master weights and AdamW moments, described by the tensor's
// global shape and slice (ckpt/ knows nothing of models; this is where the two meet).
#include <string>
#include <vector>

#include "jumbo/backend/tensor.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/model/params.h"
#include "jumbo/train/grad_sync.h"

namespace jumbo {

// One piece per parameter range (adjacent ranges of one parameter merged). The last stage's
// copy of the tied embedding is left out when `for_saving` (the first stage saves it) and
// loaded from the first stage's pieces otherwise.
std::vector<PieceData> optimizer_state_pieces(const ParamStore& params,
                                              const std::vector<OptimRange>& ranges,
                                              Tensor exp_avg, Tensor exp_avg_sq, bool for_saving);

// "tp0-pp1-dp0.h5": the shard file of a rank, named by its grid coordinates.
std::string shard_file_name(int tp_rank, int pp_rank, int dp_rank);

}  // namespace jumbo
