#include "jumbo/parallel/groups.h"

namespace jumbo {

ProcessGroups process_groups(Grid& grid) {
  // Each dp rank adds the squares of its shard of every bucket (the stage plan's
  // grad_norm_ranges), so the norm's squares are summed over every rank.
  return {grid.world(), grid.tp(), grid.pp(), grid.dp(), grid.embedding(), grid.world()};
}

}  // namespace jumbo
