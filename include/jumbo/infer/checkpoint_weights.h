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
#include "jumbo/train/checkpoint_io.h"

namespace jumbo {

// load_weights (train/checkpoint_io.h) loads a stage's weights in any layout.

// jumbo's GPT as the checkpoint tools list it (model/checkpoint_names.h): for inspect and the
// exports.
TensorListing gpt_tensor_listing();

}  // namespace jumbo
