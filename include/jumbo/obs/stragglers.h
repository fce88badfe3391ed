#pragma once
// Stragglers: every log interval each rank's compute time (step time outside communication
// waits) and time waiting in communication are gathered on rank 0 (a fixed record per rank,
// gathered once per interval after the step's stop-signal reduction, which already meets every
// rank: no extra barrier). A slow rank computes longer while the others wait for it, so each
// rank is compared with the median compute time of its pipeline stage (stages differ in work).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/comm/comm.h"

namespace jumbo {

struct RankTimes {
  struct Spread {
    double min = 0, median = 0, max = 0;
  };
  struct Straggler {
    int rank = 0;
    std::string host;
    double ratio = 0;       // compute time / its stage's median
    int64_t intervals = 0;  // in a row above log.straggler_ratio
  };
  Spread compute_s, wait_s;
  int slowest_rank = 0;  // the highest compute time relative to its stage's median
  std::string slowest_host;
  double slowest_ratio = 1;
  std::vector<Straggler> stragglers;  // flagged this interval
};

class StragglerDetector {
 public:
  // `stage`: this rank's pipeline stage; ratio and intervals: log.straggler_ratio and
  // log.straggler_intervals.
  StragglerDetector(Comm& world, int stage, double ratio, int64_t intervals);
  // Collective over the world: this rank's seconds of the interval. Rank 0 gets the report.
  std::optional<RankTimes> gather(double compute_s, double wait_s);

 private:
  Comm& world_;
  int stage_;
  std::string host_;
  double ratio_;
  int64_t intervals_;
  std::map<int, int64_t> slow_for_;  // rank 0: ranks above the ratio, intervals in a row
};

// "ranks: compute min 0.051 s | median 0.052 s | max 0.410 s; waiting ...; slowest rank 3
// (host b) 7.9x its stage's median", and one "straggler: ..." line per flagged rank.
std::vector<std::string> rank_times_lines(const RankTimes& t, double ratio);

}  // namespace jumbo
