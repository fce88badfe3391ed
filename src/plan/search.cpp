// Layout search and the step-time model of docs/plan.md. The time model only ranks layouts;
// it is not a measurement and `jumbo plan` says so.
#include "jumbo/plan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "jumbo/model/flops.h"

namespace jumbo {
namespace {

constexpr double kGemmEfficiency = 0.6;  // share of peak a large bf16 GEMM sustains

double gib(double bytes) { return bytes / static_cast<double>(1ull << 30); }

bool divides(int64_t d, int64_t n) { return d > 0 && n % d == 0; }

}  // namespace

void estimate_time(const PlanRequest& r, PlanCandidate& c) {
  const Layout& l = c.layout;
  const ModelConfig& m = r.model;
  const int64_t seq = r.target.seq > 0 ? r.target.seq : m.context;
  const double world = static_cast<double>(l.tp * l.pp * l.dp);
  const double peak = r.gpu.bf16_tflops * 1e12;
  const double model_flops = model_flops_per_iteration(m, r.target.global_batch, seq);
  // Full recomputation runs each layer's forward twice: 4/3 of the model FLOPs.
  const bool full = l.recompute == Recompute::full;
  const double hw_flops = model_flops * (full ? 4.0 / 3.0 : 1.0);
  const double compute = hw_flops / (world * peak * kGemmEfficiency);
  const int64_t micro = c.memory.microbatches;
  c.bubble = static_cast<double>(l.pp - 1) / static_cast<double>(l.virtual_stages * micro);

  // Tensor parallelism: per layer and microbatch two collectives forward and two backward
  // (two more when the forward is recomputed), each of the b s h bf16 activations, over a
  // ring inside the node.
  const double act_bytes = 2.0 * static_cast<double>(l.micro_batch * seq * m.d_model);
  const double ring = l.tp > 1 ? 2.0 * static_cast<double>(l.tp - 1) / static_cast<double>(l.tp) : 0;
  const double passes = full ? 6 : 4;
  const double layers = static_cast<double>(c.memory.layers);
  const double tp_time =
      layers * static_cast<double>(micro) * passes * ring * act_bytes / (r.gpu.nvlink_bus_gbps * 1e9);
  // Data parallelism: reduce-scatter (or all-reduce) of the f32 main grads and, with
  // ZeRO-1, the all-gather of bf16 weights, over the node's EFA shared by its GPUs. Counted
  // as not overlapped with the backward: an upper bound.
  const double per_gpu_net = r.gpu.node_network_gbits / 8.0 * 1e9 / static_cast<double>(r.gpus_per_node);
  const double n = static_cast<double>(c.memory.params);
  const double dp_ring = l.dp > 1 ? static_cast<double>(l.dp - 1) / static_cast<double>(l.dp) : 0;
  const double dp_bytes = l.zero1_active() ? dp_ring * (4 * n + 2 * n) : 2 * dp_ring * 4 * n;
  const double dp_time = dp_bytes / per_gpu_net;
  // Pipeline: each microbatch's activations cross to the next stage and their gradients back.
  const double pp_time = l.pp > 1 ? static_cast<double>(micro) * 2 * act_bytes /
                                        static_cast<double>(l.sequence_parallel_active() ? l.tp : 1) / per_gpu_net
                                  : 0;
  c.step_time_s = compute * (1 + c.bubble) + tp_time + dp_time + pp_time;
  c.mfu = model_flops / (c.step_time_s * world * peak);
}

PlanCandidate evaluate_layout(const PlanRequest& r, const Layout& l) {
  PlanCandidate c;
  c.layout = l;
  c.memory = estimate_memory(r.model, l, r.target);
  c.fits = c.memory.total() <= static_cast<double>(r.gpu.memory_bytes);
  estimate_time(r, c);
  return c;
}

std::vector<PlanCandidate> search_layouts(const PlanRequest& r, int64_t* searched) {
  const ModelConfig& m = r.model;
  const int64_t world = r.world();
  const int64_t seq = r.target.seq > 0 ? r.target.seq : m.context;
  std::vector<PlanCandidate> fitting;
  int64_t count = 0;
  for (int64_t tp = 1; tp <= r.gpus_per_node; tp *= 2) {
    if (!divides(tp, r.gpus_per_node) || !divides(tp, m.heads) || !divides(tp, m.ffn_dim()) ||
        !divides(tp, seq))
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
            ++count;
            PlanCandidate c = evaluate_layout(r, l);
            if (c.fits) fitting.push_back(std::move(c));
          }
        }
      }
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.memory.total() > b.memory.total();
  });
  if (searched) *searched = count;
  return fitting;
}

const PlanCandidate* recommended_layout(const std::vector<PlanCandidate>& fitting) {
  const PlanCandidate* best = nullptr;
  for (const PlanCandidate& c : fitting) {
    if (!best || c.mfu > best->mfu + 1e-9 ||
        (std::abs(c.mfu - best->mfu) <= 1e-9 && c.memory.total() < best->memory.total()))
      best = &c;
  }
  return best;
}

std::string layout_overrides(const Layout& l) {
  return fmt::format(
      "--set parallel.tp={} --set parallel.pp={} --set parallel.micro_batch={} "
      "--set parallel.recompute={} --set parallel.zero1={} --set parallel.sequence_parallel={}",
      l.tp, l.pp, l.micro_batch, to_string(l.recompute), l.zero1_active() ? "true" : "false",
      l.sequence_parallel_active() ? "true" : "false");
}

std::string explain_memory(const MemoryEstimate& e, double budget_bytes, const std::string& device) {
  return fmt::format(
      "{:.1f} GiB of {:.1f} GiB per {}: weights {:.1f}, grads {:.1f}, optimizer {:.1f}, "
      "activations {:.1f} ({} microbatch{} in flight), workspace {:.1f} (stage {}: {} layers, "
      "{:.2f}B parameters)",
      gib(e.total()), gib(budget_bytes), device, gib(e.weights), gib(e.grads), gib(e.optimizer),
      gib(e.activations), e.in_flight, e.in_flight == 1 ? "" : "es", gib(e.workspace), e.stage,
      e.layers, static_cast<double>(e.params) / 1e9);
}

std::string format_plan(const PlanRequest& r, const std::vector<PlanCandidate>& fitting,
                        int64_t searched, size_t limit) {
  const ModelConfig& m = r.model;
  const int64_t seq = r.target.seq > 0 ? r.target.seq : m.context;
  std::string out = fmt::format(
      "{}: {:.1f}B parameters on {} x {} = {} x {} ({:.1f} GiB each), global batch {} x {} "
      "tokens, {}\n",
      m.name, static_cast<double>(parameter_count(m)) / 1e9, r.nodes, r.gpu.instance, r.world(),
      r.gpu.label, gib(static_cast<double>(r.gpu.memory_bytes)), r.target.global_batch, seq,
      to_string(r.target.precision));
  if (fitting.empty()) {
    out += fmt::format("none of the {} layouts fits in {:.1f} GiB per GPU: more nodes, or a "
                       "GPU with more memory\n",
                       searched, gib(static_cast<double>(r.gpu.memory_bytes)));
    return out;
  }
  const size_t shown = limit == 0 ? fitting.size() : std::min(limit, fitting.size());
  out += fmt::format("{} of {} layouts fit; memory per GPU in GiB on the fullest stage, largest "
                     "first{}:\n",
                     fitting.size(), searched,
                     shown < fitting.size() ? fmt::format(" (first {}; --limit 0 for all)", shown) : "");
  out += "  tp  pp   dp  mb recompute zero1 | weights  grads  optim  activ inflight  work |  total | bubble est.MFU\n";
  for (size_t i = 0; i < shown; ++i) {
    const PlanCandidate& c = fitting[i];
    const Layout& l = c.layout;
    const MemoryEstimate& e = c.memory;
    out += fmt::format("  {:>2} {:>3} {:>4} {:>3} {:<9} {:<5} | {:>7.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>8} "
                       "{:>5.1f} | {:>6.1f} | {:>5.1f}% {:>5.1f}%\n",
                       l.tp, l.pp, l.dp, l.micro_batch, to_string(l.recompute),
                       l.zero1_active() ? "yes" : "no",
                       gib(e.weights), gib(e.grads), gib(e.optimizer), gib(e.activations),
                       e.in_flight, gib(e.workspace), gib(e.total()), 100 * c.bubble, 100 * c.mfu);
  }
  const PlanCandidate* best = recommended_layout(fitting);
  out += fmt::format("recommended: {} (highest estimated MFU, {:.1f}%; an analytic estimate, not a "
                     "measurement)\n  memory: {}\n  overrides: {}\n",
                     best->layout.describe(), 100 * best->mfu,
                     explain_memory(best->memory, static_cast<double>(r.gpu.memory_bytes),
                                    std::string(r.gpu.label)),
                     layout_overrides(best->layout));
  return out;
}

}  // namespace jumbo
