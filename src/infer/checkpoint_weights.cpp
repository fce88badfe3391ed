#include "jumbo/infer/checkpoint_weights.h"

#include "jumbo/model/checkpoint_names.h"

#include <fmt/format.h>

#include <vector>

#include "jumbo/ckpt/checkpointer.h"

namespace jumbo {

TensorListing gpt_tensor_listing() { return {model_tensor_before, model_tensor_real_shape}; }

}  // namespace jumbo
