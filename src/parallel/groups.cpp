#include "jumbo/parallel/groups.h"

namespace jumbo {

ProcessGroups process_groups(Grid& grid, const Layout& layout) {
  // Under ZeRO-1 each dp rank holds the reduced gradients of its own shards only, so the
  // norm's squares are summed over every rank; otherwise over one model replica.
  Comm& norm = layout.zero1_active() ? grid.world() : grid.model_parallel();
  return {grid.world(), grid.tp(), grid.pp(), grid.dp(), grid.embedding(), norm};
}

}  // namespace jumbo
