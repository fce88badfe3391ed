// The stage plan: what each rank of a layout holds, as a pure function, against the closed
// forms the docs give (in-flight microbatches, the stage split) and against itself (ranges
// cover the flat buffer exactly once across the dp ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {
namespace {

ModelConfig load(const char* name) {
  return load_model_config(std::string(JUMBO_SOURCE_DIR) + "/inputs/models/" + name + ".toml");
}

ModelConfig small_model() {
  ModelConfig m;
  m.layers = 8;
  m.d_model = 64;
  m.heads = 8;
  m.ffn = 128;
  m.vocab = 1000;
  m.context = 16;
  return m;
}

// 1F1B holds min(pp - stage, m) microbatches; interleaved, Megatron's warm-up
// 2 (pp - stage - 1) + (v - 1) pp, plus one, in chunk-microbatches (at most m v).
TEST(StagePlan, SlotsAreTheMostMicrobatchesInFlight) {
  const ModelConfig m = small_model();
  for (int pp : {1, 2, 4, 8}) {
    for (int micro : {1, 3, 8, 16}) {
      for (int v : {1, 2}) {
        if (v > 1 && (micro % pp != 0 || pp == 1 || m.layers % (pp * v) != 0)) continue;
        Layout l;
        l.pp = pp;
        l.virtual_stages = v;
        const StepShape shape{.global_batch = micro};
        for (int stage = 0; stage < pp; ++stage) {
          const StagePlan plan = plan_stage(m, l, shape, {.tp_rank = 0, .dp_rank = 0, .pp_rank = stage});
          int64_t expected = 1;
          if (pp > 1 && v == 1) expected = std::min(pp - stage, micro);
          if (pp > 1 && v > 1) expected = std::min(2 * (pp - stage - 1) + (v - 1) * pp + 1, micro * v);
          EXPECT_EQ(plan.model.slots, expected) << "pp " << pp << " stage " << stage << " m " << micro
                                                << " v " << v;
          EXPECT_EQ(plan.model.slots, max_in_flight(plan.schedule));
          EXPECT_EQ(plan.microbatches, micro);
          EXPECT_EQ(plan.schedule.size(), 2u * micro * v);
        }
      }
    }
  }
}

TEST(StagePlan, BalancedSplitCountsTheEmbeddingAndHeadAsLayers) {
  const ModelConfig jumbo = load("j1-jumbo");
  Layout l;
  l.pp = 8;
  EXPECT_EQ(stage_layer_range(jumbo, l, 0).per_stage,
            (std::vector<int64_t>{8, 10, 10, 10, 10, 10, 10, 8}));
  l.stage_layers = {2, 5, 1};
  l.pp = 3;
  const StageLayers given = stage_layer_range(small_model(), l, 1);
  EXPECT_EQ(given.first_layer, 2);
  EXPECT_EQ(given.num_layers, 5);
  // Interleaved: pp x v equal chunks, rank r holding chunks r, r + pp.
  Layout v2;
  v2.pp = 2;
  v2.virtual_stages = 2;
  const StageLayers chunks = stage_layer_range(small_model(), v2, 1);
  EXPECT_EQ(chunks.first_layer, 2);
  EXPECT_EQ(chunks.num_layers, 2);
  EXPECT_EQ(chunks.chunks, 2);
  EXPECT_EQ(chunks.chunk_stride, 4);
}

TEST(StagePlan, OptionsFollowTheLayoutAndTheRank) {
  const ModelConfig m = small_model();
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.dp = 2;
  l.micro_batch = 3;
  l.recompute = Recompute::selective;
  l.sequence_parallel = true;
  const StepShape shape{.global_batch = 24, .seq = 8, .precision = Precision::bf16,
                        .eval_microbatches = 9};
  const StagePlan first = plan_stage(m, l, shape, {.tp_rank = 1, .dp_rank = 0, .pp_rank = 0});
  const StagePlan last = plan_stage(m, l, shape, {.tp_rank = 1, .dp_rank = 1, .pp_rank = 1});
  EXPECT_TRUE(first.model.has_embedding);
  EXPECT_FALSE(first.model.has_head);
  EXPECT_TRUE(last.model.has_head);
  EXPECT_FALSE(last.model.has_embedding);
  EXPECT_EQ(first.microbatches, 4);  // 24 / (3 x 2)
  EXPECT_EQ(first.eval_microbatches, 9);
  EXPECT_EQ(first.model.losses_per_read, 9);  // the longer of a step and an evaluation
  EXPECT_EQ(first.model.seq, 8);
  EXPECT_EQ(first.model.micro_batch, 3);
  EXPECT_EQ(first.model.compute_dtype, DType::bf16);
  EXPECT_EQ(first.model.recompute, Recompute::selective);
  EXPECT_TRUE(first.model.sequence_parallel);
  EXPECT_EQ(first.params.total_numel() % 2, 0);
  // The vocabulary slice of tp rank 1.
  const ParamInfo& wte = first.params.info(0);
  EXPECT_EQ(wte.name, "embedding.word");
  EXPECT_EQ(wte.slice.offset[0], wte.slice.shape[0]);
}

// Across the dp ranks the optimizer ranges cover every parameter element exactly once under
// ZeRO-1, and each rank covers all of them without it; buckets tile the flat buffer.
TEST(StagePlan, OptimizerRangesPartitionTheParametersUnderZero1) {
  const ModelConfig m = small_model();
  for (bool zero1 : {false, true}) {
    Layout l;
    l.dp = 4;
    l.zero1 = zero1;
    l.bucket_size = 3000;  // several buckets that cut tensors
    const int64_t total = plan_stage(m, l, StepShape{}, {}).params.total_numel();
    std::vector<int> covered(static_cast<size_t>(total));  // flat element -> times
    for (int r = 0; r < 4; ++r) {
      const StagePlan plan = plan_stage(m, l, StepShape{}, {.tp_rank = 0, .dp_rank = r, .pp_rank = 0});
      ASSERT_EQ(plan.params.total_numel(), total);
      ASSERT_GT(plan.buckets.size(), 2u);
      EXPECT_EQ(plan.buckets.front().first, 0);
      EXPECT_EQ(plan.buckets.back().second, total);
      for (size_t b = 1; b < plan.buckets.size(); ++b)
        EXPECT_EQ(plan.buckets[b].first, plan.buckets[b - 1].second);
      int64_t state = 0;
      for (const OptimRange& o : plan.optimizer_ranges) {
        const ParamInfo& p = plan.params.info(o.param);
        EXPECT_GE(o.flat, p.flat_offset);
        EXPECT_LE(o.flat + o.count, p.flat_offset + p.numel());
        EXPECT_LE(o.local + o.count, plan.optimizer_state_elems);
        for (int64_t i = 0; i < o.count; ++i) ++covered[static_cast<size_t>(o.flat + i)];
        state += o.count;
      }
      EXPECT_LE(state, plan.optimizer_state_elems);
      EXPECT_EQ(plan.zero1, zero1);
      if (zero1) {
        EXPECT_EQ(plan.optimizer_state_elems, total / 4);
      }
    }
    // Every parameter element once (or dp times without ZeRO-1); padding never.
    const StagePlan one = plan_stage(m, l, StepShape{}, {});
    std::vector<int> expected(static_cast<size_t>(total));
    for (size_t i = 0; i < one.params.size(); ++i) {
      const ParamInfo& p = one.params.info(static_cast<int>(i));
      for (int64_t e = 0; e < p.numel(); ++e) expected[static_cast<size_t>(p.flat_offset + e)] = zero1 ? 1 : 4;
    }
    EXPECT_EQ(covered, expected);
  }
}

// Without data parallelism the optimizer updates each parameter whole (one range each).
TEST(StagePlan, OneDataParallelRankUpdatesWholeParameters) {
  const StagePlan plan = plan_stage(small_model(), Layout{}, StepShape{}, {});
  EXPECT_TRUE(plan.buckets.empty());
  EXPECT_FALSE(plan.zero1);
  ASSERT_EQ(plan.optimizer_ranges.size(), plan.params.size());
  for (size_t i = 0; i < plan.params.size(); ++i) {
    EXPECT_EQ(plan.optimizer_ranges[i].count, plan.params.info(static_cast<int>(i)).numel());
  }
  EXPECT_EQ(plan.optimizer_state_elems, plan.params.total_numel());
}

}  // namespace
}  // namespace jumbo
