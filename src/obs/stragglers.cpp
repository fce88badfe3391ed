#include "jumbo/obs/stragglers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "jumbo/comm/grid.h"

namespace jumbo {
namespace {

// What each rank sends: fixed size, so rank 0 receives world x sizeof(Record) bytes.
struct Record {
  double compute_s;
  double wait_s;
  int32_t stage;
  char host[52];
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

RankTimes::Spread spread_of(const std::vector<double>& v) {
  return {*std::min_element(v.begin(), v.end()), median_of(v), *std::max_element(v.begin(), v.end())};
}

}  // namespace

StragglerDetector::StragglerDetector(Comm& world, int stage, double ratio, int64_t intervals)
    : world_(world), stage_(stage), host_(host_name()), ratio_(ratio), intervals_(intervals) {}

std::optional<RankTimes> StragglerDetector::gather(double compute_s, double wait_s) {
  Record mine{compute_s, wait_s, stage_, {}};
  std::strncpy(mine.host, host_.c_str(), sizeof(mine.host) - 1);
  std::vector<char> bytes(sizeof(Record));
  std::memcpy(bytes.data(), &mine, sizeof(Record));
  const std::vector<std::vector<char>> all = world_.gather_bytes(bytes, 0);
  if (world_.rank() != 0) return std::nullopt;

  std::vector<Record> records(all.size());
  for (size_t r = 0; r < all.size(); ++r) std::memcpy(&records[r], all[r].data(), sizeof(Record));
  std::map<int, std::vector<double>> by_stage;
  std::vector<double> compute, wait;
  for (const Record& r : records) {
    by_stage[r.stage].push_back(r.compute_s);
    compute.push_back(r.compute_s);
    wait.push_back(r.wait_s);
  }
  std::map<int, double> stage_median;
  for (const auto& [stage, times] : by_stage) stage_median[stage] = median_of(times);

  RankTimes t;
  t.compute_s = spread_of(compute);
  t.wait_s = spread_of(wait);
  t.slowest_ratio = -1;
  std::map<int, int64_t> slow_now;
  for (size_t r = 0; r < records.size(); ++r) {
    const double median = stage_median[records[r].stage];
    const double ratio = median > 0 ? records[r].compute_s / median : 1.0;
    if (ratio > t.slowest_ratio) {
      t.slowest_ratio = ratio;
      t.slowest_rank = static_cast<int>(r);
      t.slowest_host = records[r].host;
    }
    if (ratio <= ratio_) continue;
    const auto before = slow_for_.find(static_cast<int>(r));
    const int64_t intervals = (before == slow_for_.end() ? 0 : before->second) + 1;
    slow_now[static_cast<int>(r)] = intervals;
    if (intervals >= intervals_) t.stragglers.push_back({static_cast<int>(r), records[r].host, ratio, intervals});
  }
  slow_for_ = std::move(slow_now);  // a rank back under the ratio starts again from zero
  return t;
}

std::vector<std::string> rank_times_lines(const RankTimes& t, double ratio) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format(
      "ranks: compute min {:.3f} s | median {:.3f} s | max {:.3f} s; waiting min {:.3f} s | "
      "median {:.3f} s | max {:.3f} s; slowest rank {} (host {}) {:.2f}x its stage's median",
      t.compute_s.min, t.compute_s.median, t.compute_s.max, t.wait_s.min, t.wait_s.median,
      t.wait_s.max, t.slowest_rank, t.slowest_host, t.slowest_ratio));
  for (const RankTimes::Straggler& s : t.stragglers) {
    lines.push_back(fmt::format("straggler: rank {} on host {} computed {:.2f}x its stage's "
                                "median for {} intervals in a row (log.straggler_ratio = {})",
                                s.rank, s.host, s.ratio, s.intervals, ratio));
  }
  return lines;
}

}  // namespace jumbo
