#pragma once
// The process groups one rank's step talks over, as references (Megatron-Core's
// ProcessGroupCollection): a group that is trivial for a layout is a one-rank Comm, whose
// collectives return at once, never a null pointer to test for.
#include "jumbo/comm/comm.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/layout.h"

namespace jumbo {

struct ProcessGroups {
  Comm& world;
  Comm& tp;         // tensor parallel: the layers' all-reduces and sequence gathers
  Comm& pp;         // this rank's pipeline; rank = stage
  Comm& dp;         // the data-parallel replicas of this rank's slice of the model
  Comm& embedding;  // first and last stage of the pipeline: the tied embedding's two copies
  Comm& grad_norm;  // sums the grad norm's squares (every rank adds its dp shard): the world
};

// The groups of `grid` for `layout` (the grid was built for it).
ProcessGroups process_groups(Grid& grid);

}  // namespace jumbo
