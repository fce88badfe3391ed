#include "jumbo/model/stages.h"

#include <cstdlib>

namespace jumbo {

std::vector<int64_t> balance_stage_layers(const ModelConfig& m, int64_t pp) {
  std::vector<int64_t> layers(pp, 1);
  std::vector<double> cost(pp, 1.0);
  const double ends = static_cast<double>(m.padded_vocab()) / (12.0 * static_cast<double>(m.d_model));
  cost.front() += ends;
  cost.back() += ends;
  for (int64_t left = m.layers - pp; left > 0; --left) {
    // Cheapest stage; on ties the one nearest the middle keeps the ends light.
    int64_t best = 0;
    for (int64_t s = 1; s < pp; ++s) {
      const bool cheaper = cost[s] < cost[best] - 1e-9;
      const bool tie_nearer_middle = std::abs(cost[s] - cost[best]) <= 1e-9 &&
                                     std::abs(2 * s - (pp - 1)) < std::abs(2 * best - (pp - 1));
      if (cheaper || tie_nearer_middle) best = s;
    }
    ++layers[best];
    cost[best] += 1.0;
  }
  return layers;
}

StageLayers stage_layer_range(const ModelConfig& m, int64_t pp, int64_t stage, int64_t v,
                              const std::vector<int64_t>& stage_layers) {
  StageLayers r;
  if (v > 1) {
    const int64_t per_chunk = m.layers / (pp * v);
    r.per_stage.assign(static_cast<size_t>(pp), per_chunk * v);
    r.first_layer = stage * per_chunk;
    r.num_layers = per_chunk;
    r.chunks = v;
    r.chunk_stride = pp * per_chunk;
  } else {
    r.per_stage = stage_layers.empty() ? balance_stage_layers(m, pp) : stage_layers;
    for (int64_t s = 0; s < stage; ++s) r.first_layer += r.per_stage[static_cast<size_t>(s)];
    r.num_layers = r.per_stage[static_cast<size_t>(stage)];
  }
  return r;
}

}  // namespace jumbo
