#pragma once
// Grid: world = tp x dp x pp ranks. TP varies fastest (a TP group sits on one node and shares
// NVLink), then DP, then PP: world rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
// Groups: tp, dp, pp, embedding (first and last stage of one pipeline, for the tied
// embedding). The grad norm needs no tp x pp group: it sums over the world (GradSync).
#include <memory>
#include <string>

#include "jumbo/comm/comm.h"

namespace jumbo {

// A world rank's coordinates in a tp x dp x pp grid (tp fastest, then dp, then pp); also for
// layouts no job runs in (checkpoint conversion lays out every rank of a target layout).
struct GridCoords {
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
};
GridCoords grid_coords(int rank, int tp, int dp);

class Grid {
 public:
  // Throws UserError when world size is not a multiple of tp x pp.
  Grid(std::shared_ptr<Comm> world, int tp, int pp);

  int tp_size() const { return tp_size_; }
  int pp_size() const { return pp_size_; }
  int dp_size() const { return dp_size_; }
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }
  int dp_rank() const { return dp_rank_; }
  bool first_stage() const { return pp_rank_ == 0; }
  bool last_stage() const { return pp_rank_ == pp_size_ - 1; }
  int world_rank_of(int tp_rank, int dp_rank, int pp_rank) const {
    return (pp_rank * dp_size_ + dp_rank) * tp_size_ + tp_rank;
  }

  Comm& world() { return *world_; }
  Comm& tp() { return *tp_; }
  Comm& dp() { return *dp_; }
  Comm& pp() { return *pp_; }
  // First and last stage of this pipeline (the two copies of the tied embedding); on middle
  // stages, and with pp = 1 (embedding and head are one tensor), this rank alone.
  Comm& embedding() { return *embedding_; }
  GridCoords coords() const { return {tp_rank_, dp_rank_, pp_rank_}; }
  std::shared_ptr<Comm> world_ptr() { return world_; }

 private:
  std::shared_ptr<Comm> world_, tp_, dp_, pp_, embedding_;
  int tp_size_, pp_size_, dp_size_;
  int tp_rank_, pp_rank_, dp_rank_;
};

// This process's host name (gethostname: the UTS name, which a container or namespace sets).
std::string host_name();

// Collective over the grid's world, once at start: rank 0 gets "placement: 2 hosts (a: 4
// ranks, b: 4 ranks); every tp group within one host (tp = 2)", or the first tp group that
// spans hosts (its all-reduces would cross the network); the other ranks get "". Rank 0
// receives each rank's host name once (64 bytes a rank).
std::string placement_line(Grid& grid);

}  // namespace jumbo
