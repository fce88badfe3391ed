#pragma once
// GradSync: what happens to the main grads between the backward and the optimizer
// (Megatron's finalize_model_grads), overlapped with the last microbatch's backward where
// it can be:
//  - sequence parallelism: the norms' and position embedding's gradients are partial sums
//    over tp; they are summed over tp (one coalesced all-reduce) just before the
//    data-parallel bucket holding them is launched;
//  - the tied embedding's two copies (first and last stage) are summed over the embedding
//    group before its bucket (the first, at offset 0: never reported ready) is launched;
//  - data parallelism: the flat main-grad buffer is cut into buckets (the stage plan's);
//    backward finishes gradients from the end of the buffer towards its start, and each
//    bucket is reduced (all-reduce, or reduce-scatter in place with ZeRO-1) as soon as all of
//    it is final, non-blocking.
// With ZeRO-1 dp rank r owns shard r of every bucket: the reduce-scatter leaves the reduced
// gradient of its shard where the shard's weights are (no second gradient buffer), the
// optimizer updates the shard, and the weights are all-gathered bucket by bucket, in place
// and non-blocking, overlapping the next step's forward (Megatron's overlap_param_gather):
// the forward waits for a bucket only when a layer first needs it.
#include <cstdint>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/params.h"
#include "jumbo/parallel/groups.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

class GradSync {
 public:
  // The buckets and ZeRO-1 of the rank's stage plan (none without data parallelism).
  GradSync(ParamStore& params, const ProcessGroups& groups, const StagePlan& plan);
  // Drains (below): an error unwinding past the stage must not free the weights and gradients
  // while a ring still sends from or receives into them.
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  void start_step();
  // Every gradient at flat offset >= flat_begin is final: start the buckets that are.
  void grads_ready_from(int64_t flat_begin);
  // Completes what is left (partial sums, the embedding's copies, the remaining buckets) and
  // waits for everything.
  void finish();
  // ZeRO-1: starts the all-gather of the updated weights (the compute copy), bucket by
  // bucket in flat order. Nothing without ZeRO-1.
  void start_weight_gather();
  // Every weight at flat offset < flat_end is gathered (waits for the buckets that hold
  // them): the forward's hook before each layer.
  void weights_needed_until(int64_t flat_end);
  // Every weight is gathered: before anything else reads the weights (evaluation, a save,
  // the end of a run).
  void wait_for_weights() { weights_needed_until(INT64_MAX); }
  // Waits for every non-blocking operation this rank started and has not waited for (the
  // buckets' reductions, the weights' gathers): afterwards no peer touches these buffers
  // through them. Every rank submitted the same operations in the same order, and each
  // rank's ring thread completes them whatever its main thread does, so this ends as long as
  // the peers live (a peer that hangs: the watchdog). Never throws.
  void drain() noexcept;

  bool zero1() const { return zero1_; }
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;
    CommRequest request;  // the gradient reduction
    bool launched = false;
    CommRequest gather;   // ZeRO-1: the weights' all-gather
  };
  void launch(Bucket& b);
  // Sums over tp the partial gradients at flat offsets >= flat_begin not summed yet.
  void sum_partial_grads_from(int64_t flat_begin);

  ParamStore& params_;
  Comm& dp_;
  Comm& tp_;
  Comm& embedding_;
  bool zero1_;
  std::vector<Bucket> buckets_;  // in flat order; launched from the last
  size_t next_ = 0;              // buckets_[next_ - 1 ...] not launched yet (counting down)
  // Sequence-parallel partial sums in descending flat offset: each one's offset, and its
  // gradient (the list the coalesced all-reduce takes).
  std::vector<int64_t> partial_offsets_;
  std::vector<Tensor> partial_grads_;
  size_t partial_done_ = 0;  // the first partial_done_ of them are summed this step
  int tied_embedding_ = -1;            // its parameter index, on the first and last stage
  size_t gathered_ = 0;                // buckets_[0, gathered_) have their weights
};

}  // namespace jumbo
