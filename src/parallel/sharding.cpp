#include "jumbo/parallel/sharding.h"

#include <algorithm>
#include <stdexcept>

namespace jumbo {

std::vector<std::pair<int64_t, int64_t>> dp_buckets(int64_t total, int64_t dp_size,
                                                    int64_t bucket_elems) {
  if (total % dp_size != 0) throw std::logic_error("dp_buckets: flat buffer not padded to dp");
  const int64_t size = std::max<int64_t>(dp_size, (bucket_elems + dp_size - 1) / dp_size * dp_size);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < total; b += size) out.emplace_back(b, std::min(total, b + size));
  return out;
}

std::vector<OptimRange> optimizer_ranges(const ParamStore& params,
                                         const std::vector<std::pair<int64_t, int64_t>>& buckets,
                                         int64_t dp_size, int64_t dp_rank, bool zero1,
                                         int64_t* state_elems) {
  // Buckets and parameters are both in flat order: walk them together. `first` is the first
  // parameter that may still overlap the current bucket.
  std::vector<OptimRange> ranges;
  int64_t local = 0;
  size_t first = 0;
  const size_t n = params.size();
  for (const auto& [begin, end] : buckets) {
    const int64_t shard = (end - begin) / dp_size;
    const int64_t lo = zero1 ? begin + dp_rank * shard : begin;
    const int64_t hi = zero1 ? lo + shard : end;
    while (first < n) {
      const ParamInfo& p = params.info(static_cast<int>(first));
      if (p.flat_offset + p.numel() > begin) break;
      ++first;
    }
    for (size_t i = first; i < n; ++i) {
      const ParamInfo& p = params.info(static_cast<int>(i));
      if (p.flat_offset >= hi) break;
      const int64_t s = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.numel());
      if (s < e) ranges.push_back({s, zero1 ? local + (s - lo) : s, e - s, static_cast<int>(i)});
    }
    if (zero1) local += shard;
  }
  if (state_elems) *state_elems = zero1 ? local : params.total_numel();
  return ranges;
}

std::vector<OptimRange> all_param_ranges(const ParamStore& params) {
  std::vector<OptimRange> r;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(static_cast<int>(i));
    r.push_back({p.flat_offset, p.flat_offset, p.numel(), static_cast<int>(i)});
  }
  return r;
}

std::vector<OptimRange> grad_norm_ranges(const ParamStore& params,
                                         const std::vector<OptimRange>& ranges, int tp_rank) {
  std::vector<OptimRange> out;
  for (const OptimRange& r : ranges) {
    const ParamInfo& p = params.info(r.param);
    if ((p.tp_replicated && tp_rank != 0) || p.pipeline_copy) continue;
    out.push_back(r);
  }
  return out;
}

}  // namespace jumbo
