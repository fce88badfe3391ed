#include "jumbo/comm/grid.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "jumbo/config/config.h"

namespace jumbo {

GridCoords grid_coords(int rank, int tp, int dp) {
  return {rank % tp, (rank / tp) % dp, rank / (tp * dp)};
}

Grid::Grid(std::shared_ptr<Comm> world, int tp, int pp) : world_(std::move(world)) {
  const int n = world_->size();
  if (tp < 1 || pp < 1 || n % (tp * pp) != 0) {
    throw UserError(fmt::format("world size {} is not a multiple of parallel.tp x parallel.pp = "
                                "{} x {}",
                                n, tp, pp));
  }
  tp_size_ = tp;
  pp_size_ = pp;
  dp_size_ = n / (tp * pp);
  const GridCoords at = grid_coords(world_->rank(), tp, dp_size_);
  tp_rank_ = at.tp_rank;
  dp_rank_ = at.dp_rank;
  pp_rank_ = at.pp_rank;
  // Colours name the coordinates the members share; keys order them by the varying one.
  tp_ = world_->split(pp_rank_ * dp_size_ + dp_rank_, tp_rank_, "tp");
  dp_ = world_->split(pp_rank_ * tp_size_ + tp_rank_, dp_rank_, "dp");
  pp_ = world_->split(dp_rank_ * tp_size_ + tp_rank_, pp_rank_, "pp");
  const bool ends = first_stage() || last_stage();
  embedding_ = world_->split(ends ? dp_rank_ * tp_size_ + tp_rank_ : -1, pp_rank_, "embedding");
  if (!embedding_) embedding_ = make_solo_comm("embedding");  // a middle stage
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::string placement_line(Grid& grid) {
  constexpr size_t kNameBytes = 64;
  std::vector<char> mine(kNameBytes, '\0');
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kNameBytes - 1));
  const std::vector<std::vector<char>> all = grid.world().gather_bytes(mine, 0);
  if (grid.world().rank() != 0) return "";
  std::vector<std::string> hosts;
  for (const std::vector<char>& bytes : all) hosts.emplace_back(bytes.data());
  std::map<std::string, int> ranks_on;
  for (const std::string& h : hosts) ++ranks_on[h];
  std::string listed;
  int shown = 0;
  for (const auto& [h, n] : ranks_on) {
    if (shown++ == 4) {
      listed += ", ...";
      break;
    }
    listed += fmt::format("{}{}: {} rank{}", shown > 1 ? ", " : "", h, n, n == 1 ? "" : "s");
  }
  std::string line = fmt::format("placement: {} host{} ({})", ranks_on.size(),
                                 ranks_on.size() == 1 ? "" : "s", listed);
  const int tp = grid.tp_size();
  if (tp == 1) return line + "; tp = 1";
  for (int pp = 0; pp < grid.pp_size(); ++pp) {
    for (int dp = 0; dp < grid.dp_size(); ++dp) {
      const int first = grid.world_rank_of(0, dp, pp);
      for (int t = 1; t < tp; ++t) {
        const std::string& other = hosts[static_cast<size_t>(grid.world_rank_of(t, dp, pp))];
        if (other == hosts[static_cast<size_t>(first)]) continue;
        return line + fmt::format("; the tp group of world rank {} spans hosts {} and {}: its "
                                  "all-reduces cross the network (place the {} consecutive world "
                                  "ranks of a tp group on one node)",
                                  first, hosts[static_cast<size_t>(first)], other, tp);
      }
    }
  }
  return line + fmt::format("; every tp group within one host (tp = {})", tp);
}

}  // namespace jumbo
