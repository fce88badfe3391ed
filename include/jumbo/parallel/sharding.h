#pragma once
// How a stage's flat parameter buffer is cut for data parallelism: into buckets (reduced as
// soon as backward has finished them), and, with ZeRO-1, into dp equal shards per bucket of
// which dp rank r owns shard r. The optimizer, the gradient sync, the grad norm, checkpoints
// and checkpoint conversion all read these ranges; nothing else decides them.
#include <cstdint>
#include <utility>
#include <vector>

#include "jumbo/model/params.h"

namespace jumbo {

// A range of the flat parameter buffer this rank updates; `local` indexes the optimizer
// state (Adam's moments and, in mixed precision, the fp32 master): the whole buffer, or the
// rank's shards packed under ZeRO-1. Gradients are read at `flat` (ZeRO-1 reduce-scatters
// each bucket in place, so the owned shard's gradient sits where its weights do).
struct OptimRange {
  int64_t flat = 0;
  int64_t local = 0;
  int64_t count = 0;
  int param = 0;  // index in the ParamStore
};

// Where the fp32 master weight of a range lives: in the flat weights themselves (fp32), or
// in the optimizer's state at `local` (mixed precision: bf16 weights, sharded f32 master).
enum class MasterIndex { flat, local };

// Bucket bounds [begin, end) of a flat buffer of `total` elements (a multiple of dp_size):
// buckets of bucket_elems rounded up to a multiple of dp, the last one shorter.
std::vector<std::pair<int64_t, int64_t>> dp_buckets(int64_t total, int64_t dp_size,
                                                    int64_t bucket_elems);

// The ranges dp rank `dp_rank` updates, in flat order: every parameter cut at the bucket
// bounds, or (ZeRO-1) its intersection with the rank's shard of each bucket; *state_elems
// gets the length of the optimizer state. One pass over the buckets and parameters.
std::vector<OptimRange> optimizer_ranges(const ParamStore& params,
                                         const std::vector<std::pair<int64_t, int64_t>>& buckets,
                                         int64_t dp_size, int64_t dp_rank, bool zero1,
                                         int64_t* state_elems);

// Every parameter whole, local offset = flat offset (no data parallelism).
std::vector<OptimRange> all_param_ranges(const ParamStore& params);

// The part of `ranges` this rank adds to the global gradient norm: without the parameters
// replicated over tp on tp ranks other than 0, and without the last stage's copy of the tied
// embedding. Given the rank's dp shards (ZeRO-1's ranges, whether or not ZeRO-1 is on) and
// summed over the world, their squares are the norm's square, every element counted once.
std::vector<OptimRange> grad_norm_ranges(const ParamStore& params,
                                         const std::vector<OptimRange>& ranges, int tp_rank);

}  // namespace jumbo
