#pragma once
// Data-parallel gradient synchronisation over the flat main-grad buffer, in buckets.
// Backward finishes gradients from the end of the flat buffer towards its start; each bucket
// is reduced (all-reduce, or reduce-scatter with ZeRO-1) as soon as all of it is final,
// non-blocking, so communication overlaps the rest of the last microbatch's backward.
// With ZeRO-1 every bucket is split into dp equal shards and dp rank r owns shard r of each:
// it receives the reduced gradient of its shards, updates them, and all-gathers the weights.
#include <cstdint>
#include <utility>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/params.h"

namespace jumbo {

// A range of the flat parameter buffer this rank updates; `local` indexes the optimizer
// state and the gradient source (the flat grads, or the owned-shard grads under ZeRO-1).
struct OptimRange {
  int64_t flat = 0;
  int64_t local = 0;
  int64_t count = 0;
  int param = 0;  // index in the ParamStore
};

// The bucket bounds of a flat buffer of `total` elements (a multiple of dp_size).
std::vector<std::pair<int64_t, int64_t>> dp_buckets(int64_t total, int64_t dp_size,
                                                    int64_t bucket_elems);
// The ranges dp rank `dp_rank` updates (all of them without ZeRO-1) and, in *state_elems, the
// length of its optimizer state. Used by GradSync and by checkpoint conversion.
std::vector<OptimRange> optimizer_ranges(const ParamStore& params,
                                         const std::vector<std::pair<int64_t, int64_t>>& buckets,
                                         int64_t dp_size, int64_t dp_rank, bool zero1,
                                         int64_t* state_elems);

class GradSync {
 public:
  // bucket_elems: target bucket size in elements (rounded to a multiple of dp).
  GradSync(ParamStore& params, Backend& backend, Comm& dp, int64_t bucket_elems, bool zero1);

  void start_step();
  // Every gradient at flat offset >= flat_begin is final: start the buckets that are.
  void grads_ready_from(int64_t flat_begin);
  // Starts what is left and waits for everything.
  void finish();
  // ZeRO-1: all-gather the updated weights of every bucket (the compute copy).
  void gather_weights();

  const std::vector<OptimRange>& ranges() const { return ranges_; }
  int64_t state_elems() const { return state_elems_; }
  // The gradients the optimizer reads at OptimRange::local offsets.
  Tensor optimizer_grads() const;
  bool zero1() const { return zero1_; }
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;
    int64_t owned_local = 0;  // ZeRO-1: where this bucket's owned shard sits in owned_grads_
    CommRequest request;
    bool launched = false;
  };
  void launch(Bucket& b);

  ParamStore& params_;
  Backend& backend_;
  Comm& dp_;
  bool zero1_;
  std::vector<Bucket> buckets_;  // in flat order; launched from the last
  size_t next_ = 0;              // buckets_[next_ - 1 ...] not launched yet (counting down)
  std::vector<OptimRange> ranges_;
  int64_t state_elems_ = 0;
  Arena owned_arena_;
  Tensor owned_grads_;
};

}  // namespace jumbo
