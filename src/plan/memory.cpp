// The memory model of docs/plan.md. Every term is a count of bytes a stage holds; the
// comments name the tensors they stand for.
#include "jumbo/plan/memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/flops.h"
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

struct Shape {
  double b, s, sp, c, cl, fl, hl, vl;  // sp: sequence part this rank holds in norm regions
  // LoRA: the r-wide intermediates x A^T of a layer's adapters, r x targets, 0 without. Each
  // is over the whole sequence on every tp rank (a column-parallel map's input is gathered,
  // a row-parallel one's partial x A^T all-reduced); B's gradient reads it. The adapters'
  // inputs are the base maps' inputs, kept already.
  double adapter_width;
};

// CPU backend: the tensors GptModel::layout_activations allocates, by name. t is the
// compute dtype's size; attention probabilities and layernorm statistics are f32.
double cpu_layer_bytes(const Shape& x, double t, bool sp, bool core_attention) {
  const double full_copy = sp ? x.b * x.s * x.c * t : 0;  // ln*_full when sequence parallel
  double bytes = 0;
  bytes += 2 * (x.b * x.sp * x.c * t + full_copy + 2 * x.b * x.sp * 4);  // ln1, ln2 (+ stats)
  bytes += x.b * x.s * 3 * x.cl * t;                                   // qkv
  if (core_attention) bytes += x.b * x.s * x.cl * t + x.b * x.hl * x.s * x.s * 4;  // atty, probs
  bytes += 2 * x.b * x.sp * x.c * t;                                   // residual2, residual3
  bytes += 2 * x.b * x.s * x.fl * t;                                   // fch, fch_gelu
  bytes += x.b * x.s * x.adapter_width * t;                            // LoRA's x A^T
  return bytes;
}

double cpu_activations(const Shape& x, const Layout& l, double t, bool first, bool last,
                       int64_t layers, int64_t slots, int64_t chunks, int64_t losses_recorded) {
  const bool sp = l.sequence_parallel_active();
  const double part = x.b * x.sp * x.c * t, full = x.b * x.s * x.c * t;
  const double n = x.b * x.s;
  // Per slot: token ids, the stage input and (without the embedding) its gradient.
  double slot = 2 * n * 4 + part + ((!first || chunks > 1) ? part : 0);
  double shared = 0;
  if (l.recompute == Recompute::full) {
    slot += layers * part;  // each layer's output (the next one's input)
    shared += cpu_layer_bytes(x, t, sp, true);
  } else if (l.recompute == Recompute::selective) {
    slot += layers * cpu_layer_bytes(x, t, sp, false);
    shared += x.b * x.s * x.cl * t + x.b * x.hl * x.s * x.s * 4;
  } else {
    slot += layers * cpu_layer_bytes(x, t, sp, true);
  }
  double bytes = slot * static_cast<double>(slots) + shared;
  if (last) {  // final norm, logits, cross-entropy parts, the step's recorded losses
    bytes += part + (sp ? full : 0) + 2 * x.b * x.sp * 4 + n * x.vl * t + 4 * n * 4 +
             4 * n * static_cast<double>(losses_recorded);
  }
  // Backward buffers shared by all layers: proj_out, dresidual, dln, datty, dqkv, dfch,
  // dfch_gelu, dprobs, and the sequence-parallel staging copies.
  bytes += full + part + full + x.b * x.s * x.cl * t + x.b * x.s * 3 * x.cl * t +
           2 * x.b * x.s * x.fl * t + x.b * x.hl * x.s * x.s * 4;
  if (sp) bytes += part + full + part + full + (first ? full : 0);
  return bytes;
}

// GPU (bf16, flash attention, no dropout): per layer and microbatch a layer keeps its input
// and the two norms' inputs... 32 s b h / t bytes with sequence parallelism: layer input,
// ln1 output, q k v, attention output, residual, ln2 output (2 each), fc1 and GELU outputs
// (8 each, ffn = 4h), plus f32 norm statistics and the attention's log-sum-exp. Without
// sequence parallelism the 8 s b h of norm regions are not divided by t.
double gpu_layer_bytes(const Shape& x) {
  const double norm_regions = 4 * 2 * x.b * x.sp * x.c;                 // input, ln1, resid, ln2
  const double tp_regions = x.b * x.s * (3 * x.cl + x.cl) * 2 + 2 * x.b * x.s * x.fl * 2;
  const double stats = 2 * 2 * x.b * x.sp * 4 + x.b * x.hl * x.s * 4;   // norm mean/rstd, LSE
  const double adapters = 2 * x.b * x.s * x.adapter_width;              // LoRA's x A^T
  return norm_regions + tp_regions + stats + adapters;
}

double gpu_activations(const Shape& x, const Layout& l, bool last, int64_t layers,
                       int64_t slots) {
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
  Shape x{};
  x.b = static_cast<double>(l.micro_batch);
  x.s = static_cast<double>(seq);
  x.sp = sp ? x.s / static_cast<double>(l.tp) : x.s;
  x.c = static_cast<double>(m.d_model);
  x.cl = x.c / static_cast<double>(l.tp);
  x.fl = static_cast<double>(m.ffn_dim()) / static_cast<double>(l.tp);
  x.hl = static_cast<double>(m.heads) / static_cast<double>(l.tp);
  x.vl = static_cast<double>(m.padded_vocab(l.tp)) / static_cast<double>(l.tp);
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
    e.activations = gpu_activations(x, l, stage == l.pp - 1, layers_per_slot, e.in_flight);
    e.workspace = runtime_bytes(PlanDevice::gpu, l.world_size());
  } else {
    const double t_size = bf16 ? 2 : 4;
    e.activations = cpu_activations(x, l, t_size, stage == 0, stage == l.pp - 1,
                                    layers_per_slot, e.in_flight, plan.layers.chunks,
                                    plan.model.losses_per_read);
    // bf16 GEMM operands are widened to f32 in scratch sized by the largest GEMM.
    double scratch = 0;
    if (bf16) {
      const double rows = x.b * x.s;
      const double widest = std::max({x.c, x.fl, x.vl, 3 * x.cl});
      const double matrix = widest * x.c;
      scratch = 4 * (2 * rows * widest + 2 * std::max(matrix, rows * widest));
    }
    // The linear kernel for tens to hundreds of rows keeps its input panels in scratch
    // (the widest input: the MLP's second GEMM or the model width).
    scratch += static_cast<double>(
        cpu_linear_scratch_bytes(static_cast<int64_t>(x.b * x.s), static_cast<int64_t>(std::max(x.c, x.fl))));
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
