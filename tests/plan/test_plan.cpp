// The memory model and layout search of docs/plan.md, against the formulas of the papers.
// (What a stage holds, in-flight microbatches included, is the stage plan's: tests/parallel.)
#include <gtest/gtest.h>

#include <fmt/format.h>

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
  r.nodes = nodes;
  r.set_gpu(*find_gpu(gpu), 8);
  r.target.device = PlanDevice::gpu;
  r.target.precision = Precision::bf16;
  r.target.global_batch = 1536;
  return r;
}

// GPT-2 124M on one 8-GPU node in bf16: a small model for the time terms worked by hand.
PlanRequest gpt2_on_one_node() {
  PlanRequest r;
  r.model = load("gpt2-124m");
  r.nodes = 1;
  r.set_gpu(*find_gpu("a100-40gb"), 8);
  r.target.device = PlanDevice::gpu;
  r.target.precision = Precision::bf16;
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

TEST(PlanSearch, JumboOn64P4dNodesFitsAndTheListIsFastestFirst) {
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
      EXPECT_LE(fitting[i - 1].step_time_s, fitting[i].step_time_s);
      EXPECT_TRUE(faster_layout(fitting[i - 1], fitting[i]));
    }
  }
  // The recommendation is the fastest that fits: the first row, with the highest MFU.
  const PlanCandidate* best = recommended_layout(fitting);
  ASSERT_EQ(best, &fitting.front());
  for (const PlanCandidate& c : fitting) EXPECT_LE(c.mfu, best->mfu + 1e-12);
  // 178B parameters need more than 18 bytes x 178B / 40 GiB = 75 GPUs of model parallelism
  // without ZeRO-1, and more than 6 bytes x 178B / 40 GiB = 25 with it.
  for (const PlanCandidate& c : fitting)
    EXPECT_GE(c.layout.tp * c.layout.pp, c.layout.zero1 ? 25 : 75);
  // The estimated MFU is in the range Megatron-LM reports for this size on A100s.
  EXPECT_GT(best->mfu, 0.30);
  EXPECT_LT(best->mfu, 0.60);
}

TEST(PlanSearch, StepTimeIsTheSumOfItsTerms) {
  const PlanRequest r = jumbo_on(64);
  for (const PlanCandidate& c : search_layouts(r)) {
    EXPECT_DOUBLE_EQ(c.step_time_s, c.compute_s + c.elementwise_s + c.recompute_s + c.tp_comm_s +
                                        c.pp_comm_s + c.bubble_s + c.dp_comm_s + c.optimizer_s);
    EXPECT_DOUBLE_EQ(c.bubble_s,
                     (c.compute_s + c.elementwise_s + c.recompute_s + c.tp_comm_s) * c.bubble);
    EXPECT_LE(c.dp_comm_s, c.dp_total_s);  // what hides behind the backward is not counted
    EXPECT_EQ(c.recompute_s > 0, c.layout.recompute != Recompute::none);
    EXPECT_EQ(c.tp_comm_s > 0, c.layout.tp > 1);
    EXPECT_EQ(c.dp_comm_s > 0, c.layout.dp > 1);
    EXPECT_EQ(c.pp_comm_s > 0, c.layout.pp > 1);
  }
}

// The compute and elementwise terms count each pass at its own rate and each kernel where it
// runs (docs/plan.md "The step-time model"), checked by hand on a small model of one stage.
TEST(PlanTime, PassesAtTheirRatesAndElementwiseWhereTheKernelsRun) {
  PlanRequest r = gpt2_on_one_node();
  r.target.global_batch = 8;
  const auto plan = [&](int64_t tp, bool sp, Recompute recompute) {
    const Layout l{.tp = tp, .pp = 1, .dp = 1, .micro_batch = 8 / 1, .virtual_stages = 1,
                   .stage_layers = {}, .sequence_parallel = sp, .recompute = recompute,
                   .zero1 = false};
    return evaluate_layout(r, l);
  };
  const ModelConfig& m = r.model;
  const double s = static_cast<double>(m.context), h = static_cast<double>(m.d_model);
  const double tokens = 8 * s, layers = static_cast<double>(m.layers);
  const double value = tokens * h * 2 / r.machine.memory_bandwidth;  // one b s h of bf16
  const double f_share = static_cast<double>(m.ffn_dim()) / h;
  const double head = tokens * 5 * 4 * static_cast<double>(m.padded_vocab(1)) /
                      r.machine.memory_bandwidth;
  // One rank: 22 + 5 f/h values a layer, the head's cross-entropy.
  EXPECT_NEAR(plan(1, false, Recompute::none).elementwise_s,
              layers * (22 + 5 * f_share) * value + head, 1e-12);
  // tp 2: the norm regions whole on each rank, the GELU halved.
  const PlanCandidate tp2 = plan(2, false, Recompute::none);
  const double head2 = tokens * 5 * 4 * static_cast<double>(m.padded_vocab(2)) / 2 /
                       r.machine.memory_bandwidth;
  EXPECT_NEAR(tp2.elementwise_s, layers * (22 + 5 * f_share / 2) * value + head2, 1e-12);
  // Sequence parallelism: the norm regions halved, and a copy of b s h (2 values) at each of a
  // layer's 8 collectives and the embedding's and the head's 2 each.
  EXPECT_NEAR(plan(2, true, Recompute::none).elementwise_s,
              layers * (11 + 5 * f_share / 2 + 16) * value + head2 + 8 * value, 1e-12);
  // Without measured shapes both passes run at one rate: full recompute is a third of the
  // layers' compute and their forward elementwise values.
  const PlanCandidate none = plan(1, false, Recompute::none);
  const PlanCandidate full = plan(1, false, Recompute::full);
  const double head_gemm = 6 * tokens * h * static_cast<double>(m.padded_vocab(1)) /
                           r.machine.gemm_rate(tokens, Pass::forward);
  EXPECT_NEAR(full.recompute_s,
              (none.compute_s - head_gemm) / 3 + layers * (10 + 2 * f_share) * value, 1e-9);
  // A measured machine whose forward GEMMs run twice as fast as its backward ones: the same
  // FLOPs take 1/3 / 2 + 2/3 of the time at the backward rate, and the recompute half of it.
  Machine fast_forward = r.machine;
  fast_forward.gemm_by_rows = {.rows = {1}, .forward = {0.6}, .backward = {0.3}};
  fast_forward.attention_by_shape = {.seq = {1}, .head_dim = {1}, .forward = {0.4}, .backward = {0.4}};
  r.set_machine(fast_forward);
  const PlanCandidate measured = plan(1, false, Recompute::full);
  const double attention = 6 * 8 * s * s * h * layers / (r.machine.peak_flops * 0.4);
  const double gemm_at_backward_rate = (none.compute_s - attention) * 2;  // none ran at 0.6
  EXPECT_NEAR(measured.compute_s - attention, gemm_at_backward_rate * (1.0 / 6 + 2.0 / 3), 1e-9);
  EXPECT_NEAR(measured.recompute_s - layers * (10 + 2 * f_share) * value,
              (gemm_at_backward_rate - head_gemm * 2) / 6 + attention / 3, 1e-9);
}

// The pipeline's transfers count as far as the schedule exposes them (parallel/
// pipeline_schedule.h's simulate_pipeline). One microbatch on two stages waits for both of
// its transfers; more microbatches hide some, not all (each receive is posted one op ahead,
// so a transfer often starts only when its data is wanted), and fewer between CPU hosts,
// where a transfer also needs its sender between ops (MPI over TCP).
TEST(PlanTime, PipelineTransfersAsTheScheduleExposesThem) {
  PlanRequest r = gpt2_on_one_node();
  const auto plan = [&](int64_t global_batch, int64_t v) {
    r.target.global_batch = global_batch;
    const Layout l{.tp = 1, .pp = 2, .dp = 1, .micro_batch = 1, .virtual_stages = v,
                   .stage_layers = {}, .sequence_parallel = false, .recompute = Recompute::none,
                   .zero1 = false};
    return evaluate_layout(r, l).pp_comm_s;
  };
  const double act = 2.0 * static_cast<double>(r.model.context * r.model.d_model);  // bf16
  const double hop = r.machine.seconds(NetLevel::intra, Collective::p2p, act, 2);
  ASSERT_GT(hop, 0);
  EXPECT_NEAR(plan(1, 1), 2 * hop, 1e-12);
  // The same link within a host and between hosts, on GPUs and on CPUs.
  Machine same_links = r.machine;
  same_links.inter = same_links.intra;
  const auto on = [&](Device device, int64_t ranks_per_host, int64_t v) {
    Machine m = same_links;
    m.device = device;
    m.ranks_per_host = ranks_per_host;
    r.set_machine(m);
    return plan(8, v);
  };
  for (int64_t v : {1, 2}) {
    const double gpu = on(Device::cuda, 1, v);
    EXPECT_GT(gpu, 2 * hop) << "v " << v;
    EXPECT_LT(gpu, 8 * v * 2 * hop) << "v " << v;
    EXPECT_DOUBLE_EQ(on(Device::cuda, 2, v), gpu);
    EXPECT_DOUBLE_EQ(on(Device::cpu, 2, v), gpu);  // one host's shared memory
    EXPECT_GT(on(Device::cpu, 1, v), gpu) << "v " << v;  // TCP between hosts
  }
}

TEST(PlanSearch, EqualStepTimesAreOrderedByMemoryThenLayout) {
  PlanCandidate a, b;
  a.step_time_s = b.step_time_s = 10;
  a.memory.weights = 1;
  b.memory.weights = 2;
  EXPECT_TRUE(faster_layout(a, b));
  EXPECT_FALSE(faster_layout(b, a));
  b.memory.weights = 1;
  a.layout.tp = 2;
  b.layout.tp = 4;
  EXPECT_TRUE(faster_layout(a, b));
  const std::vector<PlanCandidate> both{b, a};
  EXPECT_EQ(recommended_layout(both), &both[1]);
  EXPECT_EQ(recommended_layout({}), nullptr);
}

TEST(PlanTime, DaysGpuHoursAndCostOfTheRecommendedLayout) {
  PlanRequest r = jumbo_on(128);
  r.tokens = 300e9;
  r.price_per_node_hour = 32.7726;
  const std::vector<PlanCandidate> fitting = search_layouts(r);
  ASSERT_FALSE(fitting.empty());
  const PlanCandidate& c = fitting.front();
  const TrainingCost t = training_cost(r, c);
  // 300e9 / (1536 x 2048) = 95367.43: 95368 whole steps.
  EXPECT_EQ(t.steps, 95368);
  const double days = 95368 * c.step_time_s / 86400;
  EXPECT_DOUBLE_EQ(t.days, days);
  EXPECT_DOUBLE_EQ(t.gpu_hours, days * 24 * 1024);
  EXPECT_DOUBLE_EQ(t.usd, days * 24 * 128 * 32.7726);
  // A made-up step of 20 s: 95368 x 20 s = 22.08 days, 542.5k GPU-hours, $2.22M.
  PlanCandidate twenty = c;
  twenty.step_time_s = 20;
  const TrainingCost u = training_cost(r, twenty);
  EXPECT_NEAR(u.days, 22.0759, 1e-4);
  EXPECT_NEAR(u.gpu_hours, 542538.0, 0.1);
  EXPECT_NEAR(u.usd, 2222547.4, 1);
  r.price_per_node_hour = 0;
  EXPECT_EQ(training_cost(r, twenty).usd, 0);
}

TEST(PlanTime, TheTableGainsDaysGpuHoursAndCostWithTokens) {
  PlanRequest r = jumbo_on(128);
  int64_t searched = 0;
  const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
  const std::string plain = format_plan(r, fitting, searched, 5);
  EXPECT_NE(plain.find("| bound\n"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("GPU-h"), std::string::npos) << plain;
  r.tokens = 300e9;
  const std::string costed = format_plan(r, fitting, searched, 5);
  EXPECT_NE(costed.find("|   days   GPU-h    cost\n"), std::string::npos) << costed;
  EXPECT_NE(costed.find("95368 steps"), std::string::npos) << costed;
  EXPECT_NE(costed.find("$32.77 per node-hour (p4d.24xlarge on demand"), std::string::npos) << costed;
  const TrainingCost t = training_cost(r, fitting.front());
  EXPECT_NE(costed.find(fmt::format("; {:.1f} days and $", t.days)), std::string::npos) << costed;
}

// A candidate of 10 s steps with the given overheads, 20 GiB on a 40 GiB GPU.
PlanCandidate with_overheads(double bubble_s, double comm_s) {
  PlanCandidate c;
  c.memory.weights = 20.0 * (1ull << 30);
  c.bubble_s = bubble_s;
  c.dp_comm_s = comm_s;
  c.compute_s = 10 - bubble_s - comm_s;
  c.step_time_s = 10;
  return c;
}

TEST(PlanBounds, MemoryOverNinetyPercentThenTheLargerOverheadOfAtLeastTenPercent) {
  const double gpu = 40.0 * (1ull << 30);
  EXPECT_EQ(layout_bound(with_overheads(0.5, 0.5), gpu), PlanBound::compute);
  EXPECT_EQ(layout_bound(with_overheads(0.99, 0.2), gpu), PlanBound::compute);
  EXPECT_EQ(layout_bound(with_overheads(1.0, 0.2), gpu), PlanBound::bubble);
  EXPECT_EQ(layout_bound(with_overheads(2.0, 1.5), gpu), PlanBound::bubble);
  EXPECT_EQ(layout_bound(with_overheads(1.5, 2.0), gpu), PlanBound::comm);
  // Communication counts tp, dp and pp together.
  PlanCandidate split = with_overheads(1.2, 0.5);
  split.tp_comm_s = 0.5;
  split.pp_comm_s = 0.5;
  EXPECT_EQ(layout_bound(split, gpu), PlanBound::comm);
  // Over 90% of the GPU's memory, whatever the time terms.
  PlanCandidate full = with_overheads(3, 0);
  full.memory.weights = 0.9 * gpu;
  EXPECT_EQ(layout_bound(full, gpu), PlanBound::bubble);
  full.memory.workspace = 1;
  EXPECT_EQ(layout_bound(full, gpu), PlanBound::memory);
  EXPECT_STREQ(to_string(PlanBound::memory), "memory");
  EXPECT_STREQ(to_string(PlanBound::comm), "comm");
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

namespace jumbo {
namespace {

// `jumbo plan --config` passes the run config's own rules: a layout it refuses is searched
// but never listed (slurm/train_jumbo.sh would launch it and fail, as train.eval_batches = 2
// does under dp 4).
TEST(PlanSearch, LayoutsTheRunConfigRefusesAreNotListed) {
  PlanRequest r = jumbo_on(64);
  r.accepts = [](const Layout& l, int64_t /*world*/) { return l.dp <= 2; };
  int64_t searched = 0;
  const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
  ASSERT_FALSE(fitting.empty());
  for (const PlanCandidate& c : fitting) EXPECT_LE(c.layout.dp, 2);
  int64_t all = 0;
  r.accepts = nullptr;
  search_layouts(r, &all);
  EXPECT_EQ(searched, all);  // counted as searched either way
}

}  // namespace
}  // namespace jumbo
