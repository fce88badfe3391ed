// The memory model of docs/plan.md. Every term is a count of bytes a stage holds; the
// comments name the tensors they stand for.
#include "jumbo/plan/memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/activations.h"
#include "jumbo/model/flops.h"
#include "jumbo/model/spec.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

double runtime_bytes(PlanDevice device, int64_t world) {
  // GPU: CUDA context with lazy loading (~0.5 GiB), NCCL buffers of five communicators
  // (~0.5 GiB), cuBLASLt workspaces, and slack: 1.5 GiB. CPU: the jumbo binary, its
  // libraries, Open MPI and OpenBLAS's buffers: 27 MiB measured on a run of the tiny model
  // with OpenBLAS's SSE3 and AVX2 kernels, ~1.6 MiB more with its AVX-512 (SkylakeX) ones.
  if (device == PlanDevice::gpu) return 1.5 * (1ull << 30);
  // Open MPI 4.1's MPI_Init keeps 3.3 MiB more from 3 ranks up than at 1 or 2, then stays
  // flat (a bare MPI program's peak: 10.3 MiB at 1-2 ranks, 13.5-13.8 at 3 to 32, whatever
  // the btl, coll, pml or PMIx store): the term the pp 4 x dp 2 layout missed (issue 25).
  const double mpi_world_state = world >= 3 ? 3.3 * (1ull << 20) : 0;
  return 29.5 * (1ull << 20) + mpi_world_state;
}

namespace {

// Widths of one tp rank, from the model's spec (model/spec.h).
struct Shape {
  double b, s, sp, c;  // sp: sequence part this rank holds in norm regions
  double qkv, attn;    // q k v (grouped-query attention: (heads + 2 kv_heads) D / t), o's input
  double up, ffn;      // the up projection's output (SwiGLU: gate and up) and the MLP's hidden
  double hl, vl;       // query heads, vocabulary columns
  double norm_stats;   // f32 values per row a norm keeps: LayerNorm's mean and rstd, RMSNorm's rstd
  double qk_heads;     // qk-norm: the q and k heads normed per row (their rstd), 0 without
  // LoRA: the r-wide intermediates x A^T of a layer's adapters, r x targets, 0 without. Each
  // is over the whole sequence on every tp rank (a column-parallel map's input is gathered,
  // a row-parallel one's partial x A^T all-reduced); B's gradient reads it. The adapters'
  // inputs are the base maps' inputs, kept already.
  double adapter_width;
};

// GPU (bf16, flash attention, no dropout): per layer and microbatch a layer keeps its input
// and the two norms' inputs... 32 s b h / t bytes for GPT with sequence parallelism: layer
// input, ln1 output, residual, ln2 output (2 each, norm regions), q k v (3h / t), attention
// output (h / t), fc1 and GELU outputs (4h / t each), plus f32 norm statistics and the
// attention's log-sum-exp. From the spec: q k v are (H + 2G) D / t wide, SwiGLU's up output
// 2f / t and its product f / t, RMSNorm keeps rstd alone. Without sequence parallelism the
// 8 s b h of norm regions are not divided by t.
double gpu_layer_bytes(const Shape& x) {
  const double norm_regions = 4 * 2 * x.b * x.sp * x.c;                 // input, ln1, resid, ln2
  const double tp_regions = x.b * x.s * (x.qkv + x.attn) * 2 + x.b * x.s * (x.up + x.ffn) * 2;
  const double stats = 2 * x.norm_stats * x.b * x.sp * 4 + x.b * x.hl * x.s * 4;  // norms, LSE
  const double adapters = 2 * x.b * x.s * x.adapter_width;              // LoRA's x A^T
  // qk-norm: q k v before the heads' norm (its backward's input) and each head's rstd.
  const double qk_norm = x.qk_heads > 0 ? x.b * x.s * (x.qkv * 2 + x.qk_heads * 4) : 0;
  return norm_regions + tp_regions + stats + adapters + qk_norm;
}

double gpu_activations(const Shape& x, const ModelSpec& spec, const Layout& l, bool last,
                       int64_t layers, int64_t slots) {
  const double part = 2 * x.b * x.sp * x.c;
  double per_microbatch =
      l.recompute == Recompute::full ? layers * part : layers * gpu_layer_bytes(x);
  double bytes = per_microbatch * static_cast<double>(slots);
  // One layer being recomputed or back-propagated at a time: its activations and their
  // gradients live while it runs.
  bytes += 2 * gpu_layer_bytes(x);
  // The head holds one microbatch: bf16 logits and the f32 softmax the cross-entropy
  // backward reads, vocab-parallel (V / t columns).
  if (last) bytes += x.b * x.s * x.vl * (2 + 4) + 2 * part;
  // Pipeline send and receive buffers, both directions.
  if (l.pp > 1) bytes += 4 * part;
  // RoPE: the f32 [context, head_dim] table of cos and sin, and the i32 positions of a
  // microbatch's rows, once per stage.
  if (spec.rope()) bytes += 4 * static_cast<double>(spec.rope_table_elements()) + 4 * x.b * x.s;
  return bytes;
}

}  // namespace

MemoryEstimate estimate_stage_memory(const ModelConfig& m, const Layout& l, const PlanTarget& t,
                                     int64_t stage) {
  const StepShape shape{.global_batch = t.global_batch, .seq = t.seq, .precision = t.precision};
  const StagePlan plan = plan_stage(m, l, shape, {.tp_rank = 0, .dp_rank = 0,
                                                  .pp_rank = static_cast<int>(stage)});
  int64_t base = 0;
  for (size_t i = 0; i < plan.params.size(); ++i)
    base += plan.params.info(static_cast<int>(i)).numel();
  // The flat buffers the optimizer reads are padded so dp shards divide them.
  const auto dp_padded = [&l](int64_t count) { return (count + l.dp - 1) / l.dp * l.dp; };
  const bool lora = t.fine_tune == FineTune::lora;
  const bool bf16 = t.precision == Precision::bf16;

  MemoryEstimate e;
  e.stage = stage;
  e.layers = plan.layers.num_layers * plan.layers.chunks;
  // LoRA trains the adapters of the stage's layers; the base is frozen in the compute dtype
  // (embeddings, norms and biases too): no master, no gradient, no Adam, nothing to shard.
  e.params = lora ? base : dp_padded(base);
  const LoraLayerShard adapters_per_layer =
      lora ? lora_layer_adapters(m, t.lora.rank, t.lora.targets, l.tp) : LoraLayerShard{};
  e.trained_params = lora ? dp_padded(e.layers * adapters_per_layer.held()) : e.params;
  e.frozen_weights = lora ? static_cast<double>(base) * (bf16 ? 2 : 4) : 0;
  e.microbatches = plan.microbatches;
  e.in_flight = plan.model.slots;
  const double n = static_cast<double>(e.trained_params);
  const bool zero1 = l.zero1_active();
  const double dp = static_cast<double>(l.dp);

  const int64_t seq = plan.model.seq;
  const bool sp = l.sequence_parallel_active();
  const ModelSpec spec = model_spec(m, l.tp);
  Shape x{};
  x.b = static_cast<double>(l.micro_batch);
  x.s = static_cast<double>(seq);
  x.sp = sp ? x.s / static_cast<double>(l.tp) : x.s;
  x.c = static_cast<double>(spec.d_model);
  x.qkv = static_cast<double>(spec.qkv_local());
  x.attn = static_cast<double>(spec.attn_local());
  x.up = static_cast<double>(spec.up_local());
  x.ffn = static_cast<double>(spec.ffn_local());
  x.hl = static_cast<double>(spec.heads_local());
  x.vl = static_cast<double>(m.padded_vocab(l.tp)) / static_cast<double>(l.tp);
  x.norm_stats = spec.norm_has_bias() ? 2 : 1;
  x.qk_heads = spec.qk_norm ? static_cast<double>(spec.heads_local() + spec.kv_heads_local()) : 0;
  x.adapter_width = lora ? static_cast<double>(t.lora.rank * t.lora.targets.count()) : 0;

  // Interleaved stages hold chunk-microbatches of layers / v layers each.
  const int64_t layers_per_slot = plan.layers.num_layers;
  // Of the trained parameters: the weights in the compute dtype and the f32 main grads,
  // whole on every rank; the optimizer's f32 master (mixed precision only: in fp32 the
  // weights are the master) and Adam's two moments, 1/dp of them under ZeRO-1 (Megatron's
  // distributed optimizer): bf16 2 + 4 + 12/dp bytes per parameter, fp32 4 + 4 + 8/dp.
  e.weights = n * (bf16 ? 2 : 4);
  e.grads = 4 * n;
  e.optimizer = (bf16 ? 12 : 8) * n / (zero1 ? dp : 1);
  if (t.device == PlanDevice::gpu) {
    e.activations = gpu_activations(x, spec, l, stage == l.pp - 1, layers_per_slot, e.in_flight);
    e.workspace = runtime_bytes(PlanDevice::gpu, l.world_size());
  } else {
    const double t_size = bf16 ? 2 : 4;
    // What TransformerStage::layout_activations allocates for this stage (model/activations.h), on
    // the CPU with S x S attention probabilities; with LoRA, its adapters' tensors too.
    StageOptions o = plan.model;
    if (lora) o.lora = LoraShape{.rank = t.lora.rank, .alpha = 0, .targets = t.lora.targets};
    e.activations = static_cast<double>(stage_activation_bytes(m, o, l.tp, seq));
    // bf16 GEMM operands are widened to f32 in scratch sized by the largest GEMM: its widest
    // side (every weight is c by one of the widths here) over the microbatch's rows.
    double scratch = 0;
    if (bf16) {
      const double rows = x.b * x.s;
      const double widest = std::max({x.c, x.qkv, x.attn, x.up, x.ffn, x.vl});
      const double matrix = widest * x.c;
      scratch = 4 * (2 * rows * widest + 2 * std::max(matrix, rows * widest));
    }
    // The linear kernel for tens to hundreds of rows keeps its input panels in scratch
    // (the widest input: the model width, the attention's output or the MLP's hidden).
    scratch += static_cast<double>(cpu_linear_scratch_bytes(
        static_cast<int64_t>(x.b * x.s), static_cast<int64_t>(std::max({x.c, x.attn, x.ffn}))));
    // The rings reduce and gather in place through one staging piece per communicator,
    // resident as far as its largest message: the data-parallel one a rank's block of the
    // largest gradient bucket (f32), the tp one (sequence parallelism's reduce-scatters) a
    // rank's block of the activations, b s/t h in the compute dtype.
    const double piece = static_cast<double>(kMpiRingStagingBytes);
    const double bucket = static_cast<double>(std::min(l.bucket_size, e.trained_params));
    const double ring_staging = (l.dp > 1 ? std::min(piece, 4 * bucket / dp) : 0) +
                                (sp ? std::min(piece, x.b * x.sp * x.c * t_size) : 0);
    e.workspace = runtime_bytes(PlanDevice::cpu, l.world_size()) + scratch + ring_staging;
  }
  return e;
}

MemoryEstimate estimate_memory(const ModelConfig& m, const Layout& l, const PlanTarget& t) {
  MemoryEstimate worst;
  for (int64_t stage = 0; stage < l.pp; ++stage) {
    MemoryEstimate e = estimate_stage_memory(m, l, t, stage);
    if (stage == 0 || e.total() > worst.total()) worst = e;
  }
  return worst;
}

}  // namespace jumbo
