// The memory model and layout search of docs/plan.md, against the formulas of the papers.
// (What a stage holds, in-flight microbatches included, is the stage plan's: tests/parallel.)
#include <gtest/gtest.h>

#include <cmath>

#include "jumbo/config/gpus.h"
#include "jumbo/model/flops.h"
#include "jumbo/plan/search.h"

namespace jumbo {
namespace {

ModelConfig load(const char* name) {
  return load_model_config(std::string(JUMBO_SOURCE_DIR) + "/inputs/models/" + name + ".toml");
}

PlanRequest jumbo_on(int64_t nodes, const char* gpu = "a100-40gb") {
  PlanRequest r;
  r.model = load("j1-jumbo");
  r.gpu = *find_gpu(gpu);
  r.nodes = nodes;
  r.gpus_per_node = 8;
  r.target.device = PlanDevice::gpu;
  r.target.precision = Precision::bf16;
  r.target.global_batch = 1536;
  return r;
}

TEST(PlanMemory, GpuWeightsGradsAndAdamAre18BytesPerParameterOr6Plus12OverDp) {
  const ModelConfig m = load("j1-large");
  PlanTarget t;
  t.global_batch = 64;
  Layout l;
  l.tp = 8;
  l.pp = 1;
  l.dp = 4;
  l.sequence_parallel = true;
  MemoryEstimate e = estimate_memory(m, l, t);
  const double n = static_cast<double>(e.params);
  EXPECT_DOUBLE_EQ(e.weights + e.grads + e.optimizer, 18 * n);
  // The distributed optimizer (Megatron's): the f32 master and Adam's moments over dp, the
  // bf16 weights and f32 grads whole: 6 + 12/dp.
  l.zero1 = true;
  e = estimate_memory(m, l, t);
  EXPECT_DOUBLE_EQ(e.weights + e.grads + e.optimizer, (6 + 12.0 / 4) * n);
  EXPECT_DOUBLE_EQ(e.optimizer, 12.0 / 4 * n);
  // fp32: the weights are the master; Adam's moments are what ZeRO-1 shards: 8 + 8/dp.
  t.precision = Precision::fp32;
  e = estimate_memory(m, l, t);
  EXPECT_DOUBLE_EQ(e.weights + e.grads + e.optimizer, (8 + 8.0 / 4) * n);
  // The tp shard of the whole model (one stage), padded vocabulary included.
  EXPECT_NEAR(n, static_cast<double>(parameter_count(m, 8)) / 8, 0.02 * n);
}

TEST(PlanMemory, GpuActivationsAre32sbhOverTPerLayerWithSequenceParallelism) {
  ModelConfig m = load("j1-jumbo");
  PlanTarget t;
  t.global_batch = 1536;
  Layout l;
  l.tp = 8;
  l.pp = 19;  // 4 layers per stage when the embedding stage is given the same
  l.dp = 1;
  l.micro_batch = 1;
  l.sequence_parallel = true;
  l.stage_layers.assign(19, 4);
  const MemoryEstimate mid = estimate_stage_memory(m, l, t, 5);
  const double s = 2048, b = 1, h = 13824, tp = 8, a = 96;
  const double per_layer = 32 * s * b * h / tp + (2 * 2 * s * b / tp * 4 + s * b * a / tp * 4);
  EXPECT_EQ(mid.in_flight, 19 - 5);
  EXPECT_EQ(mid.layers, 4);
  const double pipeline_buffers = 4 * 2 * s * b * h / tp;
  EXPECT_NEAR(mid.activations, 14 * 4 * per_layer + 2 * per_layer + pipeline_buffers, 1.0);
  // Full recomputation keeps each layer's input only.
  l.recompute = Recompute::full;
  const MemoryEstimate full = estimate_stage_memory(m, l, t, 5);
  EXPECT_NEAR(full.activations, 14 * 4 * (2 * s * b * h / tp) + 2 * per_layer + pipeline_buffers,
              1.0);
}

TEST(PlanSearch, JumboOn64P4dNodesFitsAndTheListIsLargestFirst) {
  const PlanRequest r = jumbo_on(64);
  int64_t searched = 0;
  const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
  ASSERT_FALSE(fitting.empty());
  EXPECT_GT(searched, static_cast<int64_t>(fitting.size()));
  for (size_t i = 0; i < fitting.size(); ++i) {
    const Layout& l = fitting[i].layout;
    EXPECT_LE(fitting[i].memory.total(), static_cast<double>(r.gpu.memory_bytes));
    EXPECT_LE(l.tp, 8);
    EXPECT_EQ(l.tp * l.pp * l.dp, 512);
    EXPECT_EQ(1536 % (l.micro_batch * l.dp), 0);
    if (i > 0) {
      EXPECT_GE(fitting[i - 1].memory.total(), fitting[i].memory.total());
    }
  }
  const PlanCandidate* best = recommended_layout(fitting);
  ASSERT_NE(best, nullptr);
  for (const PlanCandidate& c : fitting) EXPECT_LE(c.mfu, best->mfu + 1e-12);
  // 178B parameters need more than 18 bytes x 178B / 40 GiB = 75 GPUs of model parallelism
  // without ZeRO-1, and more than 6 bytes x 178B / 40 GiB = 25 with it.
  for (const PlanCandidate& c : fitting)
    EXPECT_GE(c.layout.tp * c.layout.pp, c.layout.zero1 ? 25 : 75);
  // The estimated MFU is in the range Megatron-LM reports for this size on A100s.
  EXPECT_GT(best->mfu, 0.30);
  EXPECT_LT(best->mfu, 0.60);
}

TEST(PlanSearch, NothingFitsOnOneNodeAndMoreMemoryFitsMore) {
  EXPECT_TRUE(search_layouts(jumbo_on(1)).empty());
  const size_t a100 = search_layouts(jumbo_on(32)).size();
  const size_t h200 = search_layouts(jumbo_on(32, "h200-141gb")).size();
  EXPECT_GT(h200, a100);
}

TEST(PlanSearch, OverridesNameEveryLayoutKey) {
  Layout l;
  l.tp = 8;
  l.pp = 16;
  l.dp = 4;
  l.micro_batch = 2;
  l.recompute = Recompute::full;
  l.zero1 = true;
  l.sequence_parallel = true;
  EXPECT_EQ(layout_overrides(l),
            "--set parallel.tp=8 --set parallel.pp=16 --set parallel.micro_batch=2 "
            "--set parallel.recompute=full --set parallel.zero1=true "
            "--set parallel.sequence_parallel=true");
}

}  // namespace
}  // namespace jumbo
