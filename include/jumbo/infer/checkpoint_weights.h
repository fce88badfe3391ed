#pragma once
// A checkpoint opened for inference (evaluation, generation, serving) on every rank, and a
// stage's weights loaded from it in any layout: only the master weights are read (not Adam's
// moments), each rank reading the shard files its own slice overlaps.
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/ckpt/tensor_listing.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/params.h"

namespace jumbo {

// Collective: world rank 0 finds the checkpoint `path` names (a step directory or a root with
// `latest`) and reads its manifest; the other ranks receive both in one broadcast, so no
// other rank reads the manifest. Throws UserError (on every rank) when it is not one.
ResolvedCheckpoint open_checkpoint(const std::string& path, const S3Options& s3, Comm& world);

// Collective over `dp`: dp rank 0 loads the master weights of `params` (a stage of any tp x pp
// layout, its shapes from gpt_stage_params) from the checkpoint and the replicas receive them;
// then the compute copy is refreshed. Throws UserError naming the file or tensor.
void load_weights(const ResolvedCheckpoint& ckpt, ParamStore& params, Backend& backend, Comm& dp);

// jumbo's GPT as the checkpoint tools list it (model/checkpoint_names.h): for inspect and the
// exports.
TensorListing gpt_tensor_listing();

}  // namespace jumbo
