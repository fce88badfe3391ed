#include "jumbo/train/grad_sync.h"

#include <algorithm>
#include <stdexcept>

namespace jumbo {

std::vector<std::pair<int64_t, int64_t>> dp_buckets(int64_t total, int64_t dp_size,
                                                    int64_t bucket_elems) {
  if (total % dp_size != 0) throw std::logic_error("GradSync: flat buffer not padded to dp");
  const int64_t size = std::max<int64_t>(dp_size, (bucket_elems + dp_size - 1) / dp_size * dp_size);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t b = 0; b < total; b += size) out.emplace_back(b, std::min(total, b + size));
  return out;
}

std::vector<OptimRange> optimizer_ranges(const ParamStore& params,
                                         const std::vector<std::pair<int64_t, int64_t>>& buckets,
                                         int64_t dp_size, int64_t dp_rank, bool zero1,
                                         int64_t* state_elems) {
  // Every parameter (plain), or its intersection with the owned shard of each bucket (ZeRO-1),
  // in flat order.
  std::vector<OptimRange> ranges;
  int64_t local = 0;
  for (const auto& [begin, end] : buckets) {
    const int64_t shard = (end - begin) / dp_size;
    const int64_t lo = zero1 ? begin + dp_rank * shard : begin;
    const int64_t hi = zero1 ? lo + shard : end;
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params.info(static_cast<int>(i));
      const int64_t s = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.numel());
      if (s < e) ranges.push_back({s, zero1 ? local + (s - lo) : s, e - s, static_cast<int>(i)});
    }
    if (zero1) local += shard;
  }
  if (state_elems) *state_elems = zero1 ? local : params.total_numel();
  return ranges;
}

GradSync::GradSync(ParamStore& params, Backend& backend, Comm& dp, int64_t bucket_elems,
                   bool zero1)
    : params_(params), backend_(backend), dp_(dp), zero1_(zero1 && dp.size() > 1) {
  const int64_t n = dp.size();
  int64_t local = 0;
  for (const auto& [begin, end] : dp_buckets(params.total_numel(), n, bucket_elems)) {
    Bucket& b = buckets_.emplace_back();
    b.begin = begin;
    b.end = end;
    b.owned_local = local;
    if (zero1_) local += (end - begin) / n;
  }
  next_ = buckets_.size();
  std::vector<std::pair<int64_t, int64_t>> bounds;
  for (const Bucket& b : buckets_) bounds.emplace_back(b.begin, b.end);
  ranges_ = optimizer_ranges(params, bounds, n, dp.rank(), zero1_, &state_elems_);
  if (zero1_) {
    owned_arena_ = backend.make_arena(static_cast<size_t>(local) * 4 + Arena::kAlign, "zero1-grads");
    owned_grads_ = owned_arena_.alloc(DType::f32, {local});
  }
}

Tensor GradSync::optimizer_grads() const { return zero1_ ? owned_grads_ : params_.all_grads(); }

void GradSync::start_step() {
  for (Bucket& b : buckets_) b.launched = false;
  next_ = buckets_.size();
}

void GradSync::launch(Bucket& b) {
  Tensor grads = params_.all_grads().rows(b.begin, b.end - b.begin);
  if (zero1_) {
    const int64_t shard = (b.end - b.begin) / dp_.size();
    b.request = dp_.ireduce_scatter(grads, owned_grads_.rows(b.owned_local, shard));
  } else {
    b.request = dp_.iall_reduce(grads, ReduceOp::sum);
  }
  b.launched = true;
}

void GradSync::grads_ready_from(int64_t flat_begin) {
  while (next_ > 0 && buckets_[next_ - 1].begin >= flat_begin) launch(buckets_[--next_]);
}

void GradSync::finish() {
  while (next_ > 0) launch(buckets_[--next_]);
  for (Bucket& b : buckets_) dp_.wait(b.request);
}

void GradSync::gather_weights() {
  if (!zero1_) return;
  Tensor weights = params_.all_compute();
  for (const Bucket& b : buckets_) {
    const int64_t shard = (b.end - b.begin) / dp_.size();
    Tensor whole = weights.rows(b.begin, b.end - b.begin);
    dp_.all_gather(whole.rows(dp_.rank() * shard, shard), whole);
  }
}

}  // namespace jumbo
