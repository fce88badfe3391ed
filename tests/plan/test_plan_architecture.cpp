// The planner reads the architecture from the model's spec (model/spec.h), GPT and Llama
// alike: the CPU activations are what TransformerStage allocates (model/activations.h, one list of
// tensors for both), the GPU formula's widths are the spec's, the time model's FLOPs and
// elementwise values are the spec's, the search skips layouts the config refuses (tp must
// divide kv_heads), and the plan prints the KV cache's bytes per token.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/gpus.h"
#include "jumbo/model/activations.h"
#include "jumbo/model/flops.h"
#include "jumbo/model/transformer.h"
#include "jumbo/model/spec.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/search.h"

namespace jumbo {
namespace {

ModelConfig load(const char* name) {
  return load_model_config(std::string(JUMBO_SOURCE_DIR) + "/inputs/models/" + name + ".toml");
}

// A tp group of `size` ranks that only answers who it is: enough to build a TransformerStage of tp
// rank 0 and count its arena (nothing here runs a collective).
class CountOnlyComm final : public Comm {
 public:
  explicit CountOnlyComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void all_reduce(Tensor, ReduceOp) override { no(); }
  CommRequest iall_reduce(Tensor, ReduceOp) override { no(); return {}; }
  void all_reduce_coalesced(std::span<const Tensor>, ReduceOp) override { no(); }
  void reduce_scatter(Tensor, Tensor) override { no(); }
  CommRequest ireduce_scatter(Tensor, Tensor) override { no(); return {}; }
  void all_gather(Tensor, Tensor) override { no(); }
  CommRequest iall_gather(Tensor, Tensor) override { no(); return {}; }
  void broadcast(Tensor, int) override { no(); }
  CommRequest isend(Tensor, int, int) override { no(); return {}; }
  CommRequest irecv(Tensor, int, int) override { no(); return {}; }
  void wait(CommRequest&) override { no(); }
  void barrier() override { no(); }
  double all_reduce_scalar(double, ReduceOp) override { no(); return 0; }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>&, int) override {
    no();
    return {};
  }
  void broadcast_bytes(std::vector<char>&, int) override { no(); }
  std::shared_ptr<Comm> split(int, int, const std::string&) override { no(); return nullptr; }

 private:
  [[noreturn]] static void no() { throw std::logic_error("CountOnlyComm: no collectives"); }
  int size_;
  std::string name_ = "tp";
};

// What a TransformerStage of these options on tp rank 0 of `tp` allocates for its activations.
int64_t model_activation_bytes(const ModelConfig& cfg, const StageOptions& o, int tp,
                               Backend& backend) {
  CountOnlyComm comm(tp);
  const TransformerStage model(cfg, o, backend, comm);
  return static_cast<int64_t>(model.activation_bytes());
}

ModelConfig llama_gqa() {
  ModelConfig m = load("tiny-llama");  // 4 query heads over 2 key/value heads, SwiGLU, RoPE
  m.layers = 6;
  return m;
}

TEST(PlanArchitecture, StageActivationsAreWhatTransformerStageAllocatesForGptAndLlama) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  ModelConfig gpt = load("tiny");
  gpt.layers = 6;
  const int64_t stats_cols = backend->attention_stats_cols(16);
  int checked = 0;
  ModelConfig qk_norm = llama_gqa();  // Qwen 3's and OLMo 2's RMSNorm of each q and k head
  qk_norm.name = "tiny-llama-qk-norm";
  qk_norm.qk_norm = true;
  for (const ModelConfig& cfg : {gpt, llama_gqa(), qk_norm}) {
    for (const auto& [tp, sp] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
      for (Recompute recompute : {Recompute::none, Recompute::selective, Recompute::full}) {
        for (DType dtype : {DType::f32, DType::bf16}) {
          for (int stage = 0; stage < 4; ++stage) {
            for (int lora = 0; lora < 3; ++lora) {
              StageOptions o;
              o.micro_batch = 2;
              o.seq = 16;
              o.compute_dtype = dtype;
              o.recompute = recompute;
              o.sequence_parallel = sp;
              o.losses_per_read = 3;
              // The whole model; a first stage; a last; a middle one of two chunks.
              o.first_layer = stage == 2 ? 4 : stage == 3 ? 1 : 0;
              o.num_layers = stage == 0 ? -1 : stage == 3 ? 1 : 2;
              o.has_embedding = stage <= 1;
              o.has_head = stage == 0 || stage == 2;
              o.slots = stage == 1 ? 3 : stage == 3 ? 2 : 1;
              o.chunks = stage == 3 ? 2 : 1;
              o.chunk_stride = stage == 3 ? 3 : 0;
              if (lora > 0) {
                o.lora = LoraShape{.rank = 4, .alpha = 8, .targets = LoraTargetSet{}};
                if (lora == 2) {
                  o.lora.targets = LoraTargetSet::none();
                  o.lora.targets.add(LoraTarget::proj);
                  o.lora.targets.add(LoraTarget::fc1);
                  o.lora_dropout = 0.1f;
                }
              }
              const std::string what =
                  fmt::format("{} tp {} sp {} recompute {} {} stage {} lora {}", cfg.name, tp, sp,
                              to_string(recompute), dtype == DType::bf16 ? "bf16" : "f32", stage,
                              lora);
              EXPECT_EQ(stage_activation_bytes(cfg, o, tp, stats_cols),
                        model_activation_bytes(cfg, o, tp, *backend))
                  << what;
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 * 3 * 2 * 4 * 3);
}

// The planner's CPU activations for every stage of Llama layouts: the stage plan's model, built.
TEST(PlanArchitecture, CpuPlanOfALlamaLayoutHoldsWhatItsStagesAllocate) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  const ModelConfig m = llama_gqa();
  for (const auto& [tp, pp, recompute, sp] :
       {std::tuple{1, 3, Recompute::none, false}, std::tuple{2, 2, Recompute::full, true},
        std::tuple{2, 1, Recompute::selective, false}}) {
    for (FineTune fine_tune : {FineTune::none, FineTune::lora}) {
      Layout l;
      l.tp = tp;
      l.pp = pp;
      l.dp = 2;
      l.micro_batch = 2;
      l.recompute = recompute;
      l.sequence_parallel = sp;
      PlanTarget t;
      t.device = PlanDevice::cpu;
      t.precision = Precision::bf16;
      t.global_batch = 16;
      t.fine_tune = fine_tune;
      t.lora.rank = 8;
      for (int64_t stage = 0; stage < pp; ++stage) {
        const MemoryEstimate e = estimate_stage_memory(m, l, t, stage);
        StepShape shape{.global_batch = 16, .precision = Precision::bf16};
        if (fine_tune == FineTune::lora) {
          shape.lora = LoraShape{.rank = 8, .alpha = 16, .targets = LoraTargetSet{}};
        }
        const StagePlan plan =
            plan_stage(m, l, shape, {.tp_rank = 0, .dp_rank = 0, .pp_rank = static_cast<int>(stage)});
        EXPECT_EQ(e.activations,
                  static_cast<double>(model_activation_bytes(m, plan.model, tp, *backend)))
            << "tp " << tp << " pp " << pp << " stage " << stage << " "
            << to_string(fine_tune);
      }
    }
  }
}

// The GPU formula of docs/plan.md with the spec's widths: q k v (H + 2G) D / t, the attention
// output H D / t, SwiGLU's up output 2f / t and its product f / t, RMSNorm's rstd alone, and
// RoPE's table and positions once per stage.
TEST(PlanArchitecture, GpuActivationsOfALlamaLayerUseTheSpecsWidths) {
  const ModelConfig m = load("llama3-8b");
  const ModelSpec spec = model_spec(m);
  PlanTarget t;
  t.global_batch = 64;
  Layout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 1;
  l.micro_batch = 1;
  l.sequence_parallel = true;
  l.stage_layers = {8, 8, 8, 8};
  const MemoryEstimate mid = estimate_stage_memory(m, l, t, 1);
  const double s = static_cast<double>(m.context), b = 1, h = 4096, tp = 8;
  const double heads = 32, groups = 8, d = 128, f = 14336;
  const double per_layer = 4 * 2 * b * s * h / tp + b * s * ((heads + 2 * groups) * d / tp + heads * d / tp) * 2 +
                           b * s * (2 * f / tp + f / tp) * 2 + 2 * 1 * b * s / tp * 4 +
                           b * heads / tp * s * 4;
  const double rope = 4 * s * d + 4 * b * s;
  EXPECT_EQ(static_cast<double>(spec.rope_table_elements()), s * d);
  EXPECT_EQ(mid.in_flight, 3);
  EXPECT_NEAR(mid.activations,
              3 * 8 * per_layer + 2 * per_layer + 4 * 2 * b * s * h / tp + rope, 1.0);
  // qk-norm keeps q k v before the heads' norm and each head's f32 rstd.
  ModelConfig qk = m;
  qk.qk_norm = true;
  const double qk_extra = b * s * ((heads + 2 * groups) * d / tp * 2 + (heads + groups) / tp * 4);
  EXPECT_NEAR(estimate_stage_memory(qk, l, t, 1).activations - mid.activations,
              (3 * 8 + 2) * qk_extra, 1.0);
}

TEST(PlanArchitecture, ElementwiseValuesFollowTheSpec) {
  const ModelConfig gpt = load("gpt2-124m");
  const LayerElementwise g = layer_elementwise_values(gpt);
  const double gf = 3072.0 / 768;
  EXPECT_DOUBLE_EQ(g.norm_regions, 22);
  EXPECT_DOUBLE_EQ(g.norm_regions_forward, 10);
  EXPECT_DOUBLE_EQ(g.tp_split, 5 * gf);
  EXPECT_DOUBLE_EQ(g.tp_split_forward, 2 * gf);
  // Llama: RMSNorm moves what LayerNorm does; SwiGLU 8 f/h (3 forward); RoPE 4 (H + G) D / h.
  const ModelConfig llama = load("llama3-8b");
  const LayerElementwise v = layer_elementwise_values(llama);
  const double lf = 14336.0 / 4096, rotated = (32.0 + 8) * 128 / 4096;
  EXPECT_DOUBLE_EQ(v.norm_regions, 22);
  EXPECT_DOUBLE_EQ(v.norm_regions_forward, 10);
  EXPECT_DOUBLE_EQ(v.tp_split, 8 * lf + 4 * rotated);
  EXPECT_DOUBLE_EQ(v.tp_split_forward, 3 * lf + 2 * rotated);
  // qk-norm: each q and k head normed as a norm's rows, 2 forward and 6 backward.
  ModelConfig qk = llama;
  qk.qk_norm = true;
  EXPECT_DOUBLE_EQ(layer_elementwise_values(qk).tp_split, 8 * lf + 4 * rotated + 8 * rotated);
  EXPECT_DOUBLE_EQ(layer_elementwise_values(qk).tp_split_forward, 3 * lf + 4 * rotated);

  // One rank of llama3.2-1b: the layers' elementwise time is theirs, the compute the spec's
  // FLOPs (grouped-query q k v, three MLP maps), the head's apart.
  PlanRequest r;
  r.model = load("llama3.2-1b");
  r.nodes = 1;
  r.set_gpu(*find_gpu("h100-80gb"), 8);
  r.target.global_batch = 8;
  r.target.seq = 1024;
  const Layout one{.tp = 1, .pp = 1, .dp = 1, .micro_batch = 8, .virtual_stages = 1,
                   .stage_layers = {}, .sequence_parallel = false, .recompute = Recompute::none,
                   .zero1 = false};
  const PlanCandidate c = evaluate_layout(r, one);
  const ModelConfig& m = r.model;
  const double tokens = 8 * 1024, h = static_cast<double>(m.d_model);
  const double value = tokens * h * 2 / r.machine.memory_bandwidth;
  const LayerElementwise e = layer_elementwise_values(m);
  const double head = tokens * 5 * 4 * static_cast<double>(m.padded_vocab(1)) / r.machine.memory_bandwidth;
  EXPECT_NEAR(c.elementwise_s,
              static_cast<double>(m.layers) * (e.norm_regions + e.tp_split) * value + head, 1e-12);
  // Without measured shapes each pass runs at one rate: the GEMMs' 6 b s (l M + V h), M with
  // the grouped q k v and SwiGLU's three maps; the attention core's 6 b s^2 l H D.
  const ModelSpec spec = model_spec(m);
  EXPECT_EQ(spec.layer_matrix_params(), 2048 * (32 + 2 * 8) * 64 + 32 * 64 * 2048 + 3 * 2048 * 8192);
  const double gemm = 6 * tokens *
                      (static_cast<double>(m.layers * spec.layer_matrix_params()) +
                       static_cast<double>(m.padded_vocab(1)) * h);
  const double attention = 6 * tokens * 1024 * static_cast<double>(m.layers * spec.attn_width());
  EXPECT_NEAR(c.compute_s,
              gemm / r.machine.gemm_rate(tokens, Pass::forward) +
                  attention / r.machine.attention_rate(1024, 64, Pass::forward),
              1e-9 * c.compute_s);
  EXPECT_NEAR(gemm + attention, model_flops_per_iteration(m, 8, 1024), 1e-9 * (gemm + attention));
}

// Each end of the pipeline weighs V h / M layers, M a layer's weight-matrix elements: GPT's
// V / (12 h), a Llama's with its grouped q k v and three MLP maps.
TEST(PlanArchitecture, TheStageSplitWeighsTheEndsByTheSpecsLayer) {
  const ModelConfig jumbo = load("j1-jumbo");  // ffn = 4h: V / (12 h), as before
  EXPECT_EQ(balance_stage_layers(jumbo, 8), (std::vector<int64_t>{8, 10, 10, 10, 10, 10, 10, 8}));
  // Llama 3 8B: V h / M = 128256 x 4096 / 218103808 = 2.41 layers at each end.
  const ModelConfig llama = load("llama3-8b");
  const ModelSpec spec = model_spec(llama);
  EXPECT_EQ(spec.layer_matrix_params(), 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336);
  EXPECT_EQ(balance_stage_layers(llama, 4), (std::vector<int64_t>{7, 9, 9, 7}));
}

// A layout the config refuses is not searched: tiny-llama's 2 key/value heads allow tp 1 and 2
// only, though its 4 query heads would take tp 4.
TEST(PlanArchitecture, TheSearchSkipsLayoutsWhoseTpDoesNotDivideTheKeyValueHeads) {
  PlanRequest r;
  r.model = load("tiny-llama");
  r.nodes = 1;
  r.set_gpu(*find_gpu("a100-40gb"), 4);
  r.target.global_batch = 16;
  int64_t searched = 0;
  const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
  ASSERT_FALSE(fitting.empty());
  bool tp2 = false;
  for (const PlanCandidate& c : fitting) {
    EXPECT_LE(c.layout.tp, 2);
    EXPECT_NO_THROW(validate_layout(c.layout, r.model, "test", LayoutKeys::flags));
    tp2 = tp2 || c.layout.tp == 2;
  }
  EXPECT_TRUE(tp2);
}

TEST(PlanArchitecture, Llama70BOnEightH100NodesListsLayoutsAndTheKvCacheLine) {
  for (FineTune fine_tune : {FineTune::none, FineTune::lora}) {
    PlanRequest r;
    r.model = load("llama3-70b");
    r.nodes = 8;
    r.set_gpu(*find_gpu("h100-80gb"), 8);
    r.target.global_batch = 1536;
    r.target.fine_tune = fine_tune;
    int64_t searched = 0;
    const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
    ASSERT_FALSE(fitting.empty()) << to_string(fine_tune);
    for (const PlanCandidate& c : fitting) {
      EXPECT_EQ(8 % c.layout.tp, 0);
      EXPECT_GT(c.memory.activations, 0);
      EXPECT_GT(c.step_time_s, 0);
      EXPECT_LE(c.memory.total(), r.machine.memory_bytes);
    }
    const std::string table = format_plan(r, fitting, searched, 3);
    // 2 x 80 layers x 8 key/value heads x 128 x 2 bytes.
    EXPECT_NE(table.find("generation: KV cache 327680 bytes per token (2 x 80 layers x 8 "
                         "key/value heads x 128 x 2 bytes, bf16), 2.50 GiB per sequence of 8192 "
                         "tokens"),
              std::string::npos)
        << table;
  }
  EXPECT_EQ(kv_cache_bytes_per_token(load("llama3-8b"), Precision::fp32), 2 * 32 * 8 * 128 * 4);
  EXPECT_EQ(kv_cache_bytes_per_token(load("gpt2-124m"), Precision::bf16), 2 * 12 * 12 * 64 * 2);
}

}  // namespace
}  // namespace jumbo
