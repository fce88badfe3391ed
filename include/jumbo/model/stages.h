#pragma once
// How the layers are cut into pipeline stages.
#include <cstdint>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

// Balanced split of model.layers over pp stages, counting the embedding on the first stage
// and the head on the last as V / (12 h) layers each: that is the head's FLOPs relative to one
// layer's (2 V h against 24 h^2 per token) and the embedding's parameters relative to one
// layer's (V h against 12 h^2). Every stage gets at least one layer; the extra layers go to
// the cheapest stage, middle stages first. J1-Jumbo (76 layers) on 8 stages: 8 10 10 10 10 10 10 8.
std::vector<int64_t> balance_stage_layers(const ModelConfig& m, int64_t pp);

// The layers pipeline rank `stage` of `pp` holds: [first_layer, first_layer + num_layers) in
// each of `chunks` model chunks, chunk_stride layers apart. Interleaved (virtual_stages v > 1):
// layers cut into pp x v equal chunks, rank r holding chunks r, r + pp, ...; otherwise one
// chunk per stage from `stage_layers` (empty: balance_stage_layers).
struct StageLayers {
  int64_t first_layer = 0, num_layers = 0, chunks = 1, chunk_stride = 0;
  std::vector<int64_t> per_stage;  // layers held by each pipeline rank
};
StageLayers stage_layer_range(const ModelConfig& m, int64_t pp, int64_t stage, int64_t v,
                              const std::vector<int64_t>& stage_layers);

}  // namespace jumbo
