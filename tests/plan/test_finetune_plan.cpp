// `jumbo plan --finetune` (docs/plan.md "Fine-tuning"): LoRA's adapters, counted and sharded
// as their base maps, its frozen base, and a full fine-tune that is pre-training's plan.
#include <gtest/gtest.h>

#include "jumbo/config/gpus.h"
#include "jumbo/model/flops.h"
#include "jumbo/plan/finetune.h"
#include "jumbo/plan/search.h"

namespace jumbo {
namespace {

ModelConfig load(const char* name) {
  return load_model_config(std::string(JUMBO_SOURCE_DIR) + "/inputs/models/" + name + ".toml");
}

PlanRequest jumbo_fine_tune(FineTune method, const char* gpu = "a100-80gb") {
  PlanRequest r;
  r.model = load("j1-jumbo");
  r.nodes = 1;
  r.set_gpu(*find_gpu(gpu), 8);
  r.target.global_batch = 1536;
  r.target.fine_tune = method;
  return r;
}

constexpr int64_t kJumboLayers = 76, kJumboWidth = 13824;

TEST(LoraAdapters, Rank16OnAllFourMapsOfJumboIs16hPerRankAndLayer) {
  const ModelConfig m = load("j1-jumbo");
  const int64_t h = kJumboWidth, r = 16;
  // qkv (h in, 3h out) + proj (h, h) + fc1 (h, 4h) + fc2 (4h, h): r (in + out) each, 16 r h.
  const int64_t expected = kJumboLayers * r * ((h + 3 * h) + (h + h) + (h + 4 * h) + (4 * h + h));
  EXPECT_EQ(expected, 268'959'744);
  EXPECT_EQ(lora_adapter_params(m, r, LoraTargetSet{}), expected);
  // One map: qkv alone is r (h + 3h) per layer.
  LoraTargetSet qkv = LoraTargetSet::none();
  qkv.add(LoraTarget::qkv);
  EXPECT_EQ(lora_adapter_params(m, r, qkv), kJumboLayers * r * 4 * h);
  EXPECT_EQ(lora_adapter_params(m, r, LoraTargetSet::none()), 0);
}

TEST(LoraAdapters, TensorParallelSharesSumBackToTheWholeLayer) {
  const ModelConfig m = load("j1-jumbo");
  const int64_t h = kJumboWidth, f = m.ffn_dim(), r = 16;
  const int64_t whole = lora_layer_adapters(m, r, LoraTargetSet{}).held();
  for (int64_t tp : {1, 2, 4, 8}) {
    const LoraLayerShard s = lora_layer_adapters(m, r, LoraTargetSet{}, tp);
    // The split matrices once per tp rank, the replicated ones once.
    EXPECT_EQ(tp * s.split + s.replicated, whole) << "tp " << tp;
    // Column-parallel qkv and fc1 split B by output, replicate A [r x h]; row-parallel proj
    // and fc2 split A by input, replicate B [h x r].
    EXPECT_EQ(s.split, (3 * h + f) / tp * r + r * (h + f) / tp) << "tp " << tp;
    EXPECT_EQ(s.replicated, 4 * r * h) << "tp " << tp;
  }
  const LoraLayerShard whole_shard = lora_layer_adapters(m, r, LoraTargetSet{}, 1);
  EXPECT_EQ(whole_shard.held(), whole);
}

TEST(LoraAdapters, TargetListsParseOnceEachAndInAnyOrder) {
  const std::optional<LoraTargetSet> two = parse_lora_targets("fc2,qkv");
  ASSERT_TRUE(two);
  EXPECT_TRUE(two->has(LoraTarget::qkv));
  EXPECT_TRUE(two->has(LoraTarget::fc2));
  EXPECT_FALSE(two->has(LoraTarget::proj));
  EXPECT_EQ(two->count(), 2);
  EXPECT_EQ(describe(*two), "qkv, fc2");
  EXPECT_EQ(parse_lora_targets("qkv,proj,fc1,fc2")->bits, LoraTargetSet{}.bits);
  for (const char* bad : {"", "qkv,", ",qkv", "qkv,qkv", "attn", "QKV", "qkv proj"})
    EXPECT_FALSE(parse_lora_targets(bad)) << bad;
  EXPECT_EQ(parse_fine_tune("lora"), FineTune::lora);
  EXPECT_EQ(parse_fine_tune("full"), FineTune::full);
  EXPECT_FALSE(parse_fine_tune("none"));
  EXPECT_FALSE(parse_fine_tune("qlora"));
}

// tp 8 x pp 1 x dp 2: the whole model on each tp group, its frozen base 2 bytes per
// parameter of the rank's shard, the adapters' 2 + 4 + 12 / dp.
TEST(LoraMemory, JumboStaticMemoryIsTheFrozenBaseInBf16PlusTheAdaptersState) {
  const ModelConfig m = load("j1-jumbo");
  PlanTarget t;
  t.global_batch = 1536;
  t.fine_tune = FineTune::lora;
  t.lora.rank = 16;
  Layout l;
  l.tp = 8;
  l.pp = 1;
  l.dp = 2;
  l.sequence_parallel = true;
  l.zero1 = true;
  const MemoryEstimate e = estimate_memory(m, l, t);
  // The tp rank's base by hand: vocabulary-parallel embedding (tied), the replicated position
  // embedding, per layer the column-parallel qkv and fc1 (weights and biases split), the
  // row-parallel proj and fc2 (weights split, biases whole), the norms whole; the final norm.
  const int64_t h = kJumboWidth, f = m.ffn_dim(), tp = 8;
  const int64_t per_layer = 2 * h + (3 * h * h + 3 * h) / tp + h * h / tp + h + 2 * h +
                            (f * h + f) / tp + h * f / tp + h;
  const int64_t base =
      m.padded_vocab(tp) / tp * h + m.context * h + kJumboLayers * per_layer + 2 * h;
  EXPECT_EQ(e.params, base);
  EXPECT_DOUBLE_EQ(e.frozen_weights, 2.0 * static_cast<double>(base));
  // About params / (tp x pp): the replicated norms, biases and position embedding add 0.3%.
  EXPECT_NEAR(e.frozen_weights, 2.0 * static_cast<double>(parameter_count(m, tp)) / tp,
              0.01 * e.frozen_weights);
  const int64_t adapters = kJumboLayers * (16 * (3 * h + f) / tp + 16 * (h + f) / tp + 4 * 16 * h);
  EXPECT_EQ(e.trained_params, adapters);  // even: no dp padding
  const double n = static_cast<double>(adapters);
  EXPECT_DOUBLE_EQ(e.weights, 2 * n);
  EXPECT_DOUBLE_EQ(e.grads, 4 * n);
  EXPECT_DOUBLE_EQ(e.optimizer, 12 * n / 2);
  EXPECT_DOUBLE_EQ(e.total(), 2.0 * static_cast<double>(base) + (6 + 12.0 / 2) * n +
                                  e.activations + e.workspace);
}

TEST(LoraMemory, ActivationsArePreTrainingsPlusTheAdaptersIntermediates) {
  const ModelConfig m = load("j1-jumbo");
  PlanTarget pre;
  pre.global_batch = 1536;
  Layout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 1;
  l.micro_batch = 2;
  l.sequence_parallel = true;
  PlanTarget lora = pre;
  lora.fine_tune = FineTune::lora;
  lora.lora.rank = 32;
  const int64_t stage = 1;
  const MemoryEstimate a = estimate_stage_memory(m, l, pre, stage);
  const MemoryEstimate b = estimate_stage_memory(m, l, lora, stage);
  // Per layer and microbatch, four r-wide bf16 intermediates over the whole sequence on every
  // tp rank: each layer of each microbatch in flight, and the two layers' sets being worked on.
  const double per_layer = 4 * 2.0 * 2 * 2048 * 32;
  EXPECT_EQ(a.in_flight, b.in_flight);
  EXPECT_DOUBLE_EQ(b.activations - a.activations,
                   per_layer * static_cast<double>(b.layers * b.in_flight + 2));
  EXPECT_EQ(a.frozen_weights, 0);
}

TEST(LoraPlan, JumboFitsOnFewerGpusThanAFullFineTune) {
  const FewestNodes lora = search_fewest_nodes(jumbo_fine_tune(FineTune::lora));
  const FewestNodes full = search_fewest_nodes(jumbo_fine_tune(FineTune::full));
  ASSERT_TRUE(lora.found);
  ASSERT_TRUE(full.found);
  EXPECT_LT(lora.request.world(), full.request.world());
  // 2 bytes x 178B frozen need at least 5 A100s of 80 GiB; 6 + 12/dp bytes at least 14.
  EXPECT_GE(lora.request.world(), 5);
  EXPECT_GE(full.request.world(), 14);
  // Each is the fewest: one node fewer holds no layout.
  for (const FewestNodes* f : {&lora, &full}) {
    for (const PlanCandidate& c : f->fitting)
      EXPECT_LE(c.memory.total(), static_cast<double>(f->request.gpu.memory_bytes));
    if (f->request.nodes > 1) {
      PlanRequest fewer = f->request;
      --fewer.nodes;
      EXPECT_TRUE(search_layouts(fewer).empty());
    }
  }
  const std::string table = format_plan(lora.request, lora.fitting, lora.searched, 3);
  EXPECT_NE(table.find(", LoRA fine-tune\n"), std::string::npos) << table;
  EXPECT_NE(table.find("268959744 adapter parameters"), std::string::npos) << table;
  EXPECT_NE(table.find("3.23 GB (3227516928 bytes) with the f32 master and Adam m, v"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("|   base weights"), std::string::npos) << table;
}

TEST(FullFineTune, IsPreTrainingsPlanAtTheFineTunesBatchAndSequence) {
  PlanRequest full = jumbo_fine_tune(FineTune::full, "a100-40gb");
  full.nodes = 32;
  full.target.global_batch = 256;
  full.target.seq = 1024;
  PlanRequest pre = full;
  pre.target.fine_tune = FineTune::none;
  int64_t searched_full = 0, searched_pre = 0;
  const std::vector<PlanCandidate> a = search_layouts(full, &searched_full);
  const std::vector<PlanCandidate> b = search_layouts(pre, &searched_pre);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(searched_full, searched_pre);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].layout.describe(), b[i].layout.describe());
    EXPECT_EQ(a[i].memory.total(), b[i].memory.total());
    EXPECT_EQ(a[i].memory.trained_params, b[i].memory.params);
    EXPECT_EQ(a[i].memory.frozen_weights, 0);
    EXPECT_EQ(a[i].step_time_s, b[i].step_time_s);
  }
  const std::string heading = format_plan(full, a, searched_full, 1);
  EXPECT_NE(heading.find("global batch 256 x 1024 tokens, bf16, full fine-tune\n"
                         "full fine-tune: the memory of pre-training"),
            std::string::npos)
      << heading;
}

TEST(LoraPlan, TheFrozenBaseMovesNoGradientsOverDataParallelism) {
  PlanRequest r = jumbo_fine_tune(FineTune::lora);
  r.nodes = 4;
  PlanRequest pre = r;
  pre.target.fine_tune = FineTune::none;
  const Layout l{.tp = 8, .pp = 1, .dp = 4, .micro_batch = 1, .virtual_stages = 1,
                 .stage_layers = {}, .sequence_parallel = true, .recompute = Recompute::none,
                 .zero1 = true};
  const PlanCandidate lora = evaluate_layout(r, l), full = evaluate_layout(pre, l);
  EXPECT_LT(lora.dp_comm_s, full.dp_comm_s / 100);
  // No weights' gradients for the base: two thirds of pre-training's compute.
  EXPECT_DOUBLE_EQ(lora.compute_s, full.compute_s * 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(lora.tp_comm_s, full.tp_comm_s);
}

}  // namespace
}  // namespace jumbo
