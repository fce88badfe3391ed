#include "jumbo/infer/checkpoint_weights.h"

#include "jumbo/model/checkpoint_names.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"

namespace jumbo {

TensorListing gpt_tensor_listing() { return {gpt_tensor_before, gpt_tensor_real_shape}; }

}  // namespace jumbo
