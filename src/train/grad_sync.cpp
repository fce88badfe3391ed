#include "jumbo/train/grad_sync.h"

#include <span>

namespace jumbo {

GradSync::GradSync(ParamStore& params, const ProcessGroups& groups, const StagePlan& plan)
    : params_(params),
      dp_(groups.dp),
      tp_(groups.tp),
      embedding_(groups.embedding),
      zero1_(plan.zero1) {
  for (const auto& [begin, end] : plan.buckets) {
    Bucket& b = buckets_.emplace_back();
    b.begin = begin;
    b.end = end;
  }
  next_ = buckets_.size();
  gathered_ = buckets_.size();
  for (size_t i = params.size(); i-- > 0;) {
    const ParamInfo& p = params.info(static_cast<int>(i));
    if (p.tied_embedding) tied_embedding_ = static_cast<int>(i);
    if (!p.tp_partial_grad) continue;
    partial_offsets_.push_back(p.flat_offset);
    partial_grads_.push_back(params.grad(static_cast<int>(i)));
  }
}

GradSync::~GradSync() { drain(); }

void GradSync::drain() noexcept {
  // On an error path (an exception unwinding past the stage, a failed save every rank agreed
  // on): the weight gather started after the last optimizer step, or the bucket reductions of
  // a backward that did not finish, may still be running on the dp ring's thread, reading
  // this rank's buffers for a peer and writing the peer's blocks into them. Freeing them
  // first is a segfault here (a receive into unmapped memory) and EFAULT on the peer (its
  // single-copy read of ours).
  for (Bucket& b : buckets_) {
    try {
      dp_.wait(b.request);
      dp_.wait(b.gather);
    } catch (...) {
      // Nothing to do on the way out: the watchdog names a peer that hangs.
    }
  }
  gathered_ = buckets_.size();
}

void GradSync::start_step() {
  for (Bucket& b : buckets_) b.launched = false;
  next_ = buckets_.size();
  partial_done_ = 0;
}

void GradSync::sum_partial_grads_from(int64_t flat_begin) {
  size_t end = partial_done_;
  while (end < partial_offsets_.size() && partial_offsets_[end] >= flat_begin) ++end;
  if (end == partial_done_) return;
  tp_.all_reduce_coalesced(
      std::span<const Tensor>(partial_grads_).subspan(partial_done_, end - partial_done_),
      ReduceOp::sum);
  partial_done_ = end;
}

void GradSync::launch(Bucket& b) {
  Tensor grads = params_.all_grads().rows(b.begin, b.end - b.begin);
  if (zero1_) {
    const int64_t shard = (b.end - b.begin) / dp_.size();
    b.request = dp_.ireduce_scatter(grads, grads.rows(dp_.rank() * shard, shard));
  } else {
    b.request = dp_.iall_reduce(grads, ReduceOp::sum);
  }
  b.launched = true;
}

void GradSync::grads_ready_from(int64_t flat_begin) {
  size_t first = next_;  // the buckets [first, next_) are final now
  while (first > 0 && buckets_[first - 1].begin >= flat_begin) --first;
  if (first == next_) return;
  // Their partial sums are complete (every gradient above flat_begin is): one all-reduce.
  sum_partial_grads_from(buckets_[first].begin);
  while (next_ > first) launch(buckets_[--next_]);
}

void GradSync::finish() {
  sum_partial_grads_from(0);
  // The two copies of the tied embedding (first and last stage) get the sum of both
  // gradients, before the data-parallel reduction of the bucket that holds them.
  if (embedding_.size() > 1 && tied_embedding_ >= 0) {  // none among LoRA's adapters
    embedding_.all_reduce(params_.grad(tied_embedding_), ReduceOp::sum);
  }
  while (next_ > 0) launch(buckets_[--next_]);
  for (Bucket& b : buckets_) dp_.wait(b.request);
}

void GradSync::start_weight_gather() {
  if (!zero1_ || dp_.size() == 1) return;
  const Tensor weights = params_.all_weights();
  for (Bucket& b : buckets_) {
    const int64_t shard = (b.end - b.begin) / dp_.size();
    const Tensor whole = weights.rows(b.begin, b.end - b.begin);
    b.gather = dp_.iall_gather(whole.rows(dp_.rank() * shard, shard), whole);
  }
  gathered_ = 0;
}

void GradSync::weights_needed_until(int64_t flat_end) {
  while (gathered_ < buckets_.size() && buckets_[gathered_].begin < flat_end) {
    dp_.wait(buckets_[gathered_++].gather);
  }
}

}  // namespace jumbo
