#include "jumbo/train/grad_sync.h"

#include <algorithm>
#include <stdexcept>

namespace jumbo {

GradSync::GradSync(ParamStore& params, Backend& backend, Comm& dp, int64_t bucket_elems,
                   bool zero1)
    : params_(params), backend_(backend), dp_(dp), zero1_(zero1 && dp.size() > 1) {
  const int64_t total = params.total_numel(), n = dp.size();
  if (total % n != 0) throw std::logic_error("GradSync: flat buffer not padded to dp");
  const int64_t size = std::max<int64_t>(n, (bucket_elems + n - 1) / n * n);
  for (int64_t b = 0; b < total; b += size) buckets_.push_back({b, std::min(total, b + size)});
  next_ = buckets_.size();

  // Ranges this rank updates: every parameter (plain), or its intersection with the owned
  // shard of each bucket (ZeRO-1), in flat order.
  int64_t local = 0;
  for (Bucket& b : buckets_) {
    b.owned_local = local;
    const int64_t shard = (b.end - b.begin) / n;
    const int64_t lo = zero1_ ? b.begin + dp.rank() * shard : b.begin;
    const int64_t hi = zero1_ ? lo + shard : b.end;
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamInfo& p = params.info(static_cast<int>(i));
      const int64_t s = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.numel());
      if (s < e) ranges_.push_back({s, zero1_ ? local + (s - lo) : s, e - s, static_cast<int>(i)});
    }
    if (zero1_) local += shard;
  }
  state_elems_ = zero1_ ? local : total;
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
