// Layout search and the step-time model of docs/plan.md. The time model only ranks layouts;
// it is not a measurement and `jumbo plan` says so.
#include "jumbo/plan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "jumbo/model/activations.h"
#include "jumbo/model/flops.h"
#include "jumbo/model/spec.h"
#include "jumbo/parallel/pipeline_schedule.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {
namespace {

// layout_bound's thresholds (docs/plan.md "Time and cost to train").
constexpr double kMemoryBoundShare = 0.9;    // of the GPU's memory
constexpr double kOverheadBoundShare = 0.1;  // of the step time

double gib(double bytes) { return bytes / static_cast<double>(1ull << 30); }

bool divides(int64_t d, int64_t n) { return d > 0 && n % d == 0; }

// 300B, 590k, 2.41M: three significant figures for the table's counts and dollars.
std::string short_amount(double x) {
  static constexpr std::pair<double, const char*> kScales[] = {
      {1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "k"}, {1, ""}};
  for (const auto& [scale, suffix] : kScales) {
    if (x < scale && scale > 1) continue;
    const double v = x / scale;
    return fmt::format("{:.{}f}{}", v, v >= 100 ? 0 : v >= 10 ? 1 : 2, suffix);
  }
  return "?";
}

std::string short_days(double d) { return fmt::format("{:.{}f}", d, d >= 1 ? 1 : 3); }

}  // namespace

LayerElementwise layer_elementwise_values(const ModelConfig& m) {
  const ModelSpec spec = model_spec(m);
  const double h = static_cast<double>(spec.d_model);
  const double ffn_share = static_cast<double>(spec.ffn) / h;
  LayerElementwise v;
  // Each norm 2 forward (x read, y written) and 6 backward (x and dy read for dx, which is
  // read and written, and again for the weight's gradient), LayerNorm's and RMSNorm's alike
  // (their rows stay in cache between passes); each residual add 3 forward (its backward is
  // the norm's dx accumulation).
  v.norm_regions_forward = 2 * 2 + 2 * 3;
  v.norm_regions = v.norm_regions_forward + 2 * 6;
  // The MLP's activation over the hidden columns: GELU reads f and writes f, its backward
  // reads 2f and writes f; SwiGLU reads its gate and up (2f) and writes f, its backward reads
  // 3f and writes the gate's and up's gradients (2f).
  v.tp_split_forward = (spec.swiglu() ? 3 : 2) * ffn_share;
  v.tp_split = (spec.swiglu() ? 8 : 5) * ffn_share;
  // q and k heads, (H + G) D values: RoPE rotates them in place, read and written each
  // direction; qk-norm norms them as a norm its rows (2 forward, 6 backward).
  const double qk = static_cast<double>((spec.heads + spec.kv_heads) * spec.head_dim) / h;
  if (spec.rope()) {
    v.tp_split_forward += 2 * qk;
    v.tp_split += 4 * qk;
  }
  if (spec.qk_norm) {
    v.tp_split_forward += 2 * qk;
    v.tp_split += 8 * qk;
  }
  return v;
}

void PlanRequest::set_gpu(const GpuSpec& spec, int64_t per_node) {
  gpu = spec;
  gpus_per_node = per_node;
  machine = machine_of_gpu(spec, per_node);
  measured_machine = false;
}

void PlanRequest::set_machine(const Machine& m) {
  machine = m;
  gpus_per_node = m.ranks_per_host;
  measured_machine = true;
}

std::string PlanRequest::host_label() const {
  return measured_machine ? machine.name : std::string(gpu.instance);
}

std::string PlanRequest::device_label() const {
  return measured_machine ? std::string("rank") : std::string(gpu.label);
}

void estimate_time(const PlanRequest& r, PlanCandidate& c) {
  const Layout& l = c.layout;
  const ModelConfig& m = r.model;
  const Machine& mc = r.machine;
  const int64_t seq = r.seq();
  const double world = static_cast<double>(l.tp * l.pp * l.dp);
  // A forward is a third of the model FLOPs, the backward two thirds: the inputs' gradients
  // and the weights'. LoRA's frozen base has no weights' gradients (the adapters' are
  // negligible), so a LoRA step runs, and is credited with, two thirds: the forward and half
  // of the backward.
  const double pretraining_flops = model_flops_per_iteration(m, r.target.global_batch, seq);
  const bool lora = r.target.fine_tune == FineTune::lora;
  const double model_flops = lora ? pretraining_flops * 2.0 / 3.0 : pretraining_flops;
  const double backward_share = lora ? 0.5 : 1.0;
  // Per layer of the whole batch, split as model/flops.h counts them (below): the layer's
  // GEMMs, the attention core, the head's GEMM. Each pass at the machine's rate for it: the
  // GEMMs' at their rows (one microbatch's tokens, b s, also under sequence parallelism,
  // whose GEMMs take the gathered sequence), the attention core's at its sequence length and
  // head size.
  const double gemm_rows = static_cast<double>(l.micro_batch * seq);
  const double gemm_forward = mc.gemm_rate(gemm_rows, Pass::forward);
  const double gemm_backward = mc.gemm_rate(gemm_rows, Pass::backward);
  const ModelSpec spec = model_spec(m, l.tp);
  const double head_dim = static_cast<double>(spec.head_dim);
  const double attention_forward = mc.attention_rate(static_cast<double>(seq), head_dim, Pass::forward);
  const double attention_backward = mc.attention_rate(static_cast<double>(seq), head_dim, Pass::backward);
  // A pass's forward is a third of its FLOPs; its backward the rest (backward_share of it).
  const auto gemm_forward_seconds = [&](double flops) { return flops / 3 / gemm_forward; };
  const auto attention_forward_seconds = [&](double flops) { return flops / 3 / attention_forward; };
  const auto gemm_seconds = [&](double flops) {
    return gemm_forward_seconds(flops) + backward_share * flops * 2 / 3 / gemm_backward;
  };
  const auto attention_seconds = [&](double flops) {
    return attention_forward_seconds(flops) + backward_share * flops * 2 / 3 / attention_backward;
  };
  const double batch = static_cast<double>(r.target.global_batch);
  const double h = static_cast<double>(m.d_model), sd = static_cast<double>(seq);
  const double vocab = static_cast<double>(m.padded_vocab(l.tp));
  // Per layer of the whole batch, as model/flops.h counts them from the spec: the layer's
  // weight matrices (q k v at (H + 2G) D columns: grouped-query attention's smaller GEMM; o;
  // the MLP's two or, SwiGLU, three maps) 6 B s M, the attention core 6 B s^2 H D (causal at
  // half), the head 6 B s h V (V padded for tp).
  const double head_flops = 6.0 * batch * sd * h * vocab;
  const double layer_attention = 6.0 * batch * sd * sd * static_cast<double>(spec.attn_width());
  const double layer_gemm = 6.0 * batch * sd * static_cast<double>(spec.layer_matrix_params());
  const double ranks_per_stage = static_cast<double>(l.tp * l.dp);
  // The memory-bound kernels between the GEMMs, at the machine's memory bandwidth, in b s h
  // values a layer (layer_elementwise_values: the spec's). In the norm regions, which every tp
  // rank runs on the whole sequence, or on its 1/tp of it under sequence parallelism: 22 (10
  // forward), the two norms (LayerNorm's and RMSNorm's alike: a forward reads x and writes y;
  // a backward reads x and dy twice and adds to dx) and residual adds. Split over tp (each
  // rank its f / tp columns or H / tp heads): the MLP's activation, GELU 5 f/h (2 forward:
  // it reads and writes the hidden columns; its backward reads two and writes one), SwiGLU
  // 8 f/h (3 forward: it reads gate and up and writes their product; its backward reads those
  // three and writes two), RoPE's rotation of q and k, 4 (H + G) D / h (2 forward: read
  // and written in place, forward and, on their gradients, backward), and qk-norm's RMSNorm
  // of each q and k head, 8 (H + G) D / h (2 forward), as a norm's. Sequence parallelism
  // also rearranges [b, s, h] to [tp, b, s/tp, h] and back around each of its collectives
  // (model/layer.cpp's TensorParallelRegion): a copy of the whole b s h, 2 values, at each of
  // a layer's 4 forward and 4 backward collectives, and at the embedding's and the head's (2
  // each). The head adds the cross-entropy's five f32 passes over the logits. Counted here
  // per layer x tp; the stage's sum is divided by tp x dp below.
  const double tokens = batch * sd;
  const double dtype_bytes = r.target.precision == Precision::bf16 ? 2 : 4;
  const double t = static_cast<double>(l.tp);
  const bool sp = l.sequence_parallel_active();
  const double value = tokens * h * dtype_bytes / mc.memory_bandwidth;  // b s h, whole batch
  const auto tp_values = [&](double norm_regions, double tp_split, double copies) {
    return (norm_regions * (sp ? 1.0 : t) + tp_split + (sp ? copies * t : 0.0)) * value;
  };
  const LayerElementwise values = layer_elementwise_values(m);
  const double layer_elementwise = tp_values(values.norm_regions, values.tp_split, 16);
  const double layer_forward_elementwise =
      tp_values(values.norm_regions_forward, values.tp_split_forward, 8);
  const double head_elementwise = tokens * 5.0 * 4.0 * vocab / mc.memory_bandwidth;
  const double edge_copies = tp_values(0, 0, 4);  // the embedding's, the head's
  // The pipeline runs at its slowest rank's pace: each rank's layers (all its chunks), the
  // last one's the head too (parallel/stage_plan.h's split counts the head as V h / M
  // layers, these FLOPs without the attention core's).
  const double layer_compute = gemm_seconds(layer_gemm) + attention_seconds(layer_attention);
  // A layer's forward: its GEMMs' and attention's, its forward elementwise values.
  const double layer_forward = gemm_forward_seconds(layer_gemm) +
                               attention_forward_seconds(layer_attention) +
                               layer_forward_elementwise;
  const std::vector<int64_t> per_stage = stage_layer_range(m, l, 0).per_stage;
  int64_t slowest = 0;
  double slowest_work = -1, slowest_forward = 0;
  for (int64_t stage = 0; stage < l.pp; ++stage) {
    const double layers = static_cast<double>(per_stage[static_cast<size_t>(stage)]);
    const bool head = stage == l.pp - 1;
    const double compute = layers * layer_compute + (head ? gemm_seconds(head_flops) : 0);
    const double elementwise = layers * layer_elementwise + (head ? head_elementwise : 0) +
                               (stage == 0 ? edge_copies : 0) + (head ? edge_copies : 0);
    // Full recomputation runs each layer's forward once more; selective, the attention
    // core's forward.
    const double recompute =
        l.recompute == Recompute::full ? layers * layer_forward
        : l.recompute == Recompute::selective
            ? layers * attention_forward_seconds(layer_attention)
            : 0;
    const double work = (compute + elementwise + recompute) / ranks_per_stage;
    if (work > slowest_work) {
      slowest_work = work;
      slowest = stage;
      slowest_forward =
          (layers * layer_forward + (head ? gemm_forward_seconds(head_flops) : 0)) /
          ranks_per_stage;
      c.compute_s = compute / ranks_per_stage;
      c.elementwise_s = elementwise / ranks_per_stage;
      c.recompute_s = recompute / ranks_per_stage;
    }
  }
  c.slowest_stage = slowest;
  const int64_t slowest_layers = per_stage[static_cast<size_t>(slowest)];
  const int64_t micro = c.memory.microbatches;
  const double v = static_cast<double>(l.virtual_stages);
  c.bubble = static_cast<double>(l.pp - 1) / (v * static_cast<double>(micro));

  // Ranks are numbered tp fastest, then dp, then pp (comm/grid.cpp): a group is inside a
  // host while its span of ranks fits in one.
  const int64_t host = mc.ranks_per_host;
  const NetLevel tp_level = l.tp <= host ? NetLevel::intra : NetLevel::inter;
  const NetLevel dp_level = l.tp * l.dp <= host ? NetLevel::intra : NetLevel::inter;
  const NetLevel pp_level = l.tp * l.dp * l.pp <= host ? NetLevel::intra : NetLevel::inter;
  const double dtype = r.target.precision == Precision::bf16 ? 2 : 4;
  const double micro_d = static_cast<double>(micro);

  // Tensor parallelism (model/layer.cpp): per layer and microbatch two all-reduces of the
  // b s h activations forward and two backward, two more when the forward is recomputed,
  // plus two per microbatch for the embedding and the head; counted on the slowest stage's
  // layers. On the critical path.
  double tp_forward_s = 0;
  if (l.tp > 1) {
    const double act = dtype * static_cast<double>(l.micro_batch * seq * m.d_model);
    // With sequence parallelism each all-reduce's place holds an all-gather and a
    // reduce-scatter (Korthikanti et al. 2022): the same bus bytes in two calls.
    const double one = l.sequence_parallel_active()
                           ? mc.seconds(tp_level, Collective::all_gather, act, l.tp) +
                                 mc.seconds(tp_level, Collective::reduce_scatter, act, l.tp)
                           : mc.seconds(tp_level, Collective::all_reduce, act, l.tp);
    const double per_layer = l.recompute == Recompute::full ? 6 : 4;
    const double layers = static_cast<double>(slowest_layers);
    c.tp_comm_s = micro_d * (layers * per_layer + 2) * one;
    tp_forward_s = micro_d * (layers * 2 + 1) * one;
  }
  // Pipeline (parallel/pipeline_schedule.h): the bubble at the schedule's closed form, and
  // the transfers between stages (each microbatch's activations forward and their gradients
  // back, once per chunk) as far as the schedule cannot hide them: the step simulated with
  // them (simulate_pipeline), each microbatch's forward and backward at the slowest stage's
  // pace, less the step without them. A transfer starts once its receive is posted, which
  // PipelineRunner does one op ahead. Between CPU hosts it also waits for its sender to be
  // between ops: Open MPI over TCP moves a large send only inside the sender's MPI calls.
  // Within a host its shared memory lets the receiver copy the data itself, and NCCL moves
  // it on the GPU while the host computes.
  const double busy = c.compute_s + c.elementwise_s + c.recompute_s + c.tp_comm_s;
  c.bubble_s = busy * c.bubble;
  if (l.pp > 1) {
    const double act = dtype * static_cast<double>(l.micro_batch * seq * m.d_model) /
                       static_cast<double>(l.sequence_parallel_active() ? l.tp : 1);
    const PipeTransfer transfer{.seconds = mc.seconds(pp_level, Collective::p2p, act, 2),
                                .needs_sender_progress =
                                    mc.device == Device::cpu && pp_level == NetLevel::inter};
    const double t_forward = (slowest_forward + tp_forward_s) / micro_d;
    const Timeline step = simulate_pipeline(static_cast<int>(l.pp), static_cast<int>(micro),
                                            static_cast<int>(l.virtual_stages), t_forward,
                                            busy / micro_d - t_forward, transfer);
    c.pp_comm_s = std::max(0.0, step.makespan - busy - c.bubble_s);
  }

  // Data parallelism (train/grad_sync.cpp): the f32 main grads of the trained parameters in
  // buckets of layout.bucket_size, each reduce-scattered (ZeRO-1) or all-reduced once the
  // last microbatch's backward has made it final; under ZeRO-1 the weights (compute dtype)
  // all-gathered after the step and waited for by the next forward, layer by layer. All but
  // the last bucket's reduction can hide behind the last backward, all but the first
  // bucket's gather behind the first forward, as far as the machine overlaps (mc.overlap).
  if (l.dp > 1) {
    const double n = static_cast<double>(c.memory.trained_params);
    const double buckets = std::max(1.0, std::ceil(n / static_cast<double>(l.bucket_size)));
    const Collective reduce =
        l.zero1_active() ? Collective::reduce_scatter : Collective::all_reduce;
    const double grads_s =
        buckets * mc.seconds(dp_level, reduce, 4 * n / buckets, l.dp, CommPath::bucketed);
    const double gather_s =
        l.zero1_active() ? buckets * mc.seconds(dp_level, Collective::all_gather,
                                                dtype * n / buckets, l.dp, CommPath::bucketed)
                         : 0;
    const double per_micro = (c.compute_s + c.elementwise_s + c.recompute_s) / micro_d;
    const double backward_window = per_micro * 2.0 / 3.0 * mc.overlap;
    const double forward_window = per_micro / 3.0 * mc.overlap;
    const double grads_exposed = std::max(grads_s / buckets, grads_s - backward_window);
    const double gather_exposed =
        l.zero1_active() ? std::max(gather_s / buckets, gather_s - forward_window) : 0;
    c.dp_total_s = grads_s + gather_s;
    c.dp_comm_s = grads_exposed + gather_exposed;
  }
  // AdamW (backend adamw) reads the grad, both moments and the f32 master and writes the
  // three back (28 bytes), plus the compute copy in bf16 (2) and the grad norm's read (4),
  // over this rank's parameters: its 1/dp shard under ZeRO-1. Memory-bound.
  const double owned = static_cast<double>(c.memory.trained_params) /
                       (l.zero1_active() ? static_cast<double>(l.dp) : 1.0);
  c.optimizer_s = owned * (28 + (r.target.precision == Precision::bf16 ? 2 : 0) + 4) /
                  mc.memory_bandwidth;
  c.step_time_s = c.compute_s + c.elementwise_s + c.recompute_s + c.tp_comm_s + c.pp_comm_s +
                  c.bubble_s + c.dp_comm_s + c.optimizer_s;
  c.mfu = model_flops / (c.step_time_s * world * mc.peak_flops);
}

std::string describe_time_terms(const PlanCandidate& c) {
  return fmt::format("compute {:.4g} s, elementwise {:.4g} s, recompute {:.4g} s, tp {:.4g} s, "
                     "pp {:.4g} s, bubble {:.4g} s ({:.1f}%), dp {:.4g} s exposed of {:.4g} s, "
                     "optimizer {:.4g} s",
                     c.compute_s, c.elementwise_s, c.recompute_s, c.tp_comm_s, c.pp_comm_s, c.bubble_s,
                     100 * c.bubble, c.dp_comm_s, c.dp_total_s, c.optimizer_s);
}

PlanCandidate evaluate_layout(const PlanRequest& r, const Layout& l) {
  PlanCandidate c;
  c.layout = l;
  c.memory = estimate_memory(r.model, l, r.target);
  c.fits = c.memory.total() <= r.machine.memory_bytes;
  estimate_time(r, c);
  return c;
}

bool faster_layout(const PlanCandidate& a, const PlanCandidate& b) {
  const auto key = [](const PlanCandidate& c) {
    const Layout& l = c.layout;
    return std::make_tuple(c.step_time_s, c.memory.total(), l.tp, l.pp, l.micro_batch,
                           l.recompute == Recompute::full, l.zero1_active());
  };
  return key(a) < key(b);
}

std::vector<PlanCandidate> search_layouts(const PlanRequest& r, int64_t* searched) {
  const ModelConfig& m = r.model;
  const int64_t world = r.world();
  const int64_t seq = r.seq();
  std::vector<PlanCandidate> fitting;
  int64_t count = 0;
  // The layout's own rules (config/validate.cpp's check_layout, as a run config's validation
  // applies them): a layout a run would refuse is not searched.
  const auto valid = [&m](const Layout& l) {
    try {
      validate_layout(l, m, "jumbo plan", LayoutKeys::flags);
      return true;
    } catch (const UserError&) {
      return false;
    }
  };
  for (int64_t tp = 1; tp <= r.gpus_per_node; tp *= 2) {
    // tp splits whole heads, whole key/value groups and the ffn's columns.
    if (!divides(tp, r.gpus_per_node) || !divides(tp, m.heads) ||
        !divides(tp, m.kv_head_count()) || !divides(tp, m.ffn_dim()) || !divides(tp, seq))
      continue;
    for (int64_t pp = 1; pp <= m.layers; ++pp) {
      if (!divides(tp * pp, world)) continue;
      const int64_t dp = world / (tp * pp);
      for (int64_t mb : {1, 2, 4, 8}) {
        if (!divides(mb * dp, r.target.global_batch)) continue;
        for (Recompute recompute : {Recompute::none, Recompute::full}) {
          for (bool zero1 : {false, true}) {
            if (zero1 && dp == 1) continue;
            const Layout l{.tp = tp, .pp = pp, .dp = dp, .micro_batch = mb, .virtual_stages = 1,
                           .stage_layers = {}, .sequence_parallel = tp > 1,
                           .recompute = recompute, .zero1 = zero1};
            if (!valid(l)) continue;
            ++count;
            if (r.accepts && !r.accepts(l, world)) continue;
            PlanCandidate c = evaluate_layout(r, l);
            if (c.fits) fitting.push_back(std::move(c));
          }
        }
      }
    }
  }
  std::sort(fitting.begin(), fitting.end(), faster_layout);
  if (searched) *searched = count;
  return fitting;
}

const PlanCandidate* recommended_layout(const std::vector<PlanCandidate>& fitting) {
  const auto best = std::min_element(fitting.begin(), fitting.end(), faster_layout);
  return best == fitting.end() ? nullptr : &*best;
}

FewestNodes search_fewest_nodes(const PlanRequest& r, int64_t max_nodes) {
  FewestNodes f;
  f.request = r;
  for (int64_t nodes = 1; nodes <= max_nodes; ++nodes) {
    f.request.nodes = nodes;
    f.fitting = search_layouts(f.request, &f.searched);
    if (!f.fitting.empty()) {
      f.found = true;
      break;
    }
  }
  return f;
}

std::string format_fewest_nodes(const FewestNodes& f) {
  const PlanRequest& r = f.request;
  if (!f.found)
    return fmt::format("fewest nodes that fit: none of 1 to {} nodes of {} x {}\n", r.nodes,
                       r.gpus_per_node, r.device_label());
  return fmt::format("fewest nodes that fit: {} x {} = {} x {} (tried 1 to {} nodes)\n", r.nodes,
                     r.host_label(), r.world(), r.device_label(), r.nodes);
}

PlanBound layout_bound(const PlanCandidate& c, double gpu_memory_bytes) {
  if (c.memory.total() > kMemoryBoundShare * gpu_memory_bytes) return PlanBound::memory;
  const double overhead = std::max(c.bubble_s, c.comm_s());
  if (overhead < kOverheadBoundShare * c.step_time_s) return PlanBound::compute;
  return c.bubble_s >= c.comm_s() ? PlanBound::bubble : PlanBound::comm;
}

const char* to_string(PlanBound b) {
  switch (b) {
    case PlanBound::compute: return "compute";
    case PlanBound::memory: return "memory";
    case PlanBound::bubble: return "bubble";
    case PlanBound::comm: return "comm";
  }
  return "?";
}

TrainingCost training_cost(const PlanRequest& r, const PlanCandidate& c) {
  TrainingCost t;
  const double tokens_per_step = static_cast<double>(r.target.global_batch * r.seq());
  t.steps = std::ceil(r.tokens / tokens_per_step);
  t.days = t.steps * c.step_time_s / 86400;
  const double node_hours = t.days * 24 * static_cast<double>(r.nodes);
  t.gpu_hours = node_hours * static_cast<double>(r.gpus_per_node);
  t.usd = node_hours * r.price_per_node_hour;
  return t;
}

std::string layout_overrides(const Layout& l) {
  return fmt::format(
      "--set parallel.tp={} --set parallel.pp={} --set parallel.micro_batch={} "
      "--set parallel.recompute={} --set parallel.zero1={} --set parallel.sequence_parallel={}",
      l.tp, l.pp, l.micro_batch, to_string(l.recompute), l.zero1_active() ? "true" : "false",
      l.sequence_parallel_active() ? "true" : "false");
}

std::string explain_memory(const MemoryEstimate& e, double budget_bytes, const std::string& device) {
  const bool frozen = e.frozen_weights > 0;
  return fmt::format(
      "{:.1f} GiB of {:.1f} GiB per {}: {}weights {:.{}f}, grads {:.{}f}, optimizer {:.{}f}, "
      "activations {:.1f} ({} microbatch{} in flight), workspace {:.1f} (stage {}: {} layers, "
      "{:.2f}B parameters{})",
      gib(e.total()), gib(budget_bytes), device,
      frozen ? fmt::format("frozen base {:.1f}, adapter ", gib(e.frozen_weights)) : "",
      gib(e.weights), frozen ? 2 : 1, gib(e.grads), frozen ? 2 : 1, gib(e.optimizer),
      frozen ? 2 : 1, gib(e.activations), e.in_flight, e.in_flight == 1 ? "" : "es",
      gib(e.workspace), e.stage, e.layers, static_cast<double>(e.params) / 1e9,
      frozen ? fmt::format(" + {:.1f}M adapter parameters",
                           static_cast<double>(e.trained_params) / 1e6)
             : "");
}

std::string format_plan(const PlanRequest& r, const std::vector<PlanCandidate>& fitting,
                        int64_t searched, size_t limit) {
  const ModelConfig& m = r.model;
  const double gpu_bytes = r.machine.memory_bytes;
  const bool costed = r.tokens > 0;
  const FineTune method = r.target.fine_tune;
  const bool lora = method == FineTune::lora;
  static constexpr const char* kMethodNames[] = {"", ", full fine-tune", ", LoRA fine-tune"};
  std::string out = fmt::format(
      "{}: {:.1f}B parameters on {} x {} = {} x {} ({:.1f} GiB each), global batch {} x {} "
      "tokens, {}{}\n",
      m.name, static_cast<double>(parameter_count(m)) / 1e9, r.nodes, r.host_label(), r.world(),
      r.device_label(), gib(gpu_bytes), r.target.global_batch, r.seq(), to_string(r.target.precision),
      kMethodNames[static_cast<int>(method)]);
  out += describe_fine_tune(m, method, r.target.lora, r.target.precision);
  // What generation adds on top of the weights (model/activations.h: the decoder's cache).
  const ModelSpec spec = model_spec(m);
  const int64_t kv_token = kv_cache_bytes_per_token(m, r.target.precision);
  out += fmt::format(
      "generation: KV cache {} bytes per token (2 x {} layers x {} key/value heads x {} x {} "
      "bytes, {}), {:.2f} GiB per sequence of {} tokens, split over tp and pp\n",
      kv_token, spec.layers, spec.kv_heads, spec.head_dim,
      r.target.precision == Precision::bf16 ? 2 : 4, to_string(r.target.precision),
      gib(static_cast<double>(kv_token * r.seq())), r.seq());
  if (fitting.empty()) {
    out += fmt::format("none of the {} layouts fits in {:.1f} GiB per GPU: more nodes, or a "
                       "GPU with more memory\n",
                       searched, gib(gpu_bytes));
    return out;
  }
  const std::string price = fmt::format("${:.2f} per node-hour", r.price_per_node_hour);
  if (costed)
    out += fmt::format("time to train {} tokens: {:.0f} steps of {} x {} tokens; cost at {}{}\n",
                       short_amount(r.tokens), training_cost(r, fitting.front()).steps,
                       r.target.global_batch, r.seq(), price,
                       r.price_per_node_hour == kP4dOnDemandUsdPerNodeHour
                           ? " (p4d.24xlarge on demand, us-east-1; --price-per-node-hour for yours)"
                           : "");
  const size_t shown = limit == 0 ? fitting.size() : std::min(limit, fitting.size());
  out += fmt::format("{} of {} layouts fit, fastest estimated step first; memory per GPU in GiB on "
                     "the fullest stage{}:\n",
                     fitting.size(), searched,
                     shown < fitting.size() ? fmt::format(" (first {}; --limit 0 for all)", shown) : "");
  if (lora) out += "  (base: the frozen weights; weights, grads, optim: the adapters')\n";
  out += fmt::format("  tp  pp   dp  mb recompute zero1 | {}weights  grads  optim  activ inflight  "
                     "work |  total | bubble  step s est.MFU | bound",
                     lora ? "  base " : "");
  out += costed ? "   |   days   GPU-h    cost\n" : "\n";
  for (size_t i = 0; i < shown; ++i) {
    const PlanCandidate& c = fitting[i];
    const Layout& l = c.layout;
    const MemoryEstimate& e = c.memory;
    const std::string bound = to_string(layout_bound(c, gpu_bytes));
    // The adapters' state is small: two decimals to tell its terms apart.
    const int adapter_digits = lora ? 2 : 1;
    out += fmt::format("  {:>2} {:>3} {:>4} {:>3} {:<9} {:<5} | {}{:>7.{}f} {:>6.{}f} {:>6.{}f} "
                       "{:>6.1f} {:>8} {:>5.1f} | {:>6.1f} | {:>5.1f}% {:>7.4g} {:>5.1f}% | {}",
                       l.tp, l.pp, l.dp, l.micro_batch, to_string(l.recompute),
                       l.zero1_active() ? "yes" : "no",
                       lora ? fmt::format("{:>6.1f} ", gib(e.frozen_weights)) : "",
                       gib(e.weights), adapter_digits, gib(e.grads), adapter_digits,
                       gib(e.optimizer), adapter_digits, gib(e.activations),
                       e.in_flight, gib(e.workspace), gib(e.total()), 100 * c.bubble, c.step_time_s, 100 * c.mfu,
                       costed ? fmt::format("{:<7}", bound) : bound);
    if (costed) {
      const TrainingCost t = training_cost(r, c);
      out += fmt::format(" | {:>6} {:>7} {:>7}", short_days(t.days), short_amount(t.gpu_hours),
                         fmt::format("${}", short_amount(t.usd)));
    }
    out += "\n";
  }
  const PlanCandidate* best = recommended_layout(fitting);
  const TrainingCost t = costed ? training_cost(r, *best) : TrainingCost{};
  out += fmt::format("recommended: {} (highest estimated MFU, {:.1f}%{}; an analytic estimate, not a "
                     "measurement)\n  memory: {}\n",
                     best->layout.describe(), 100 * best->mfu,
                     costed ? fmt::format("; {} days and ${} for {} tokens", short_days(t.days),
                                          short_amount(t.usd), short_amount(r.tokens))
                            : "",
                     explain_memory(best->memory, gpu_bytes, r.device_label()));
  if (costed)
    out += fmt::format("  time: {:.0f} steps x {:.2f} s = {} days on {} nodes, {} GPU-hours, ${} at "
                       "{}; bound: {}\n",
                       t.steps, best->step_time_s, short_days(t.days), r.nodes,
                       short_amount(t.gpu_hours), short_amount(t.usd), price,
                       to_string(layout_bound(*best, gpu_bytes)));
  out += fmt::format("  step {:.4g} s: {}\n  machine: {}{}\n", best->step_time_s,
                     describe_time_terms(*best), r.machine.name,
                     r.machine.source.empty() ? "" : fmt::format(" ({})", r.machine.source));
  out += fmt::format("  overrides: {}\n", layout_overrides(best->layout));
  return out;
}

}  // namespace jumbo
