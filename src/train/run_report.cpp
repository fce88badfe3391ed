#include "jumbo/train/run_report.h"

#include <fmt/format.h>

#include "jumbo/config/gpus.h"
#include "jumbo/model/flops.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/runtime/peak.h"
#include "jumbo/plan/search.h"

namespace jumbo {
namespace {

PlanTarget plan_target_of(const RunConfig& cfg, PlanDevice device) {
  PlanTarget t;
  t.device = device;
  t.precision = cfg.train.precision;
  t.global_batch = cfg.train.global_batch;
  t.seq = cfg.model.context;
  return t;
}

}  // namespace

PlannedMemory plan_memory(const RunConfig& cfg) {
  const Layout& layout = cfg.parallel;
  PlannedMemory out;
  out.cpu_bytes =
      estimate_memory(cfg.model, layout, plan_target_of(cfg, PlanDevice::cpu)).total();
  const MemoryEstimate e = estimate_memory(cfg.model, layout, plan_target_of(cfg, PlanDevice::gpu));
  out.gpu_bytes = e.total();
  if (cfg.train.gpu.empty()) return out;
  const GpuSpec& gpu = *find_gpu(cfg.train.gpu);  // validate() checked the name
  const double budget = static_cast<double>(gpu.memory_bytes);
  const std::string why = explain_memory(e, budget, std::string(gpu.label));
  if (e.total() > budget) {
    throw UserError(fmt::format("{}: train.gpu = \"{}\": the layout {} does not fit: {}; "
                                "`jumbo plan --config {} --nodes N` lists layouts that do",
                                cfg.source, cfg.train.gpu, layout.describe(), why, cfg.source));
  }
  out.fit_line = fmt::format("plan for train.gpu = {} ({} layout {}): fits, {}", cfg.train.gpu,
                             gpu.instance, layout.describe(), why);
  return out;
}

Peak run_peak(const RunConfig& cfg, Backend& backend) {
  if (cfg.log.peak_tflops > 0) return {cfg.log.peak_tflops, "log.peak_tflops"};
  const GpuSpec* gpu = cfg.train.gpu.empty() ? nullptr : find_gpu(cfg.train.gpu);
  if (!gpu && backend.device().kind() == Device::cuda) {
    gpu = gpu_from_device_name(backend.device().name(), backend.device().memory().total);
    if (!gpu) {
      throw UserError(fmt::format("{}: {} is not a GPU jumbo knows the peak of: set train.gpu "
                                  "(one of {}) or log.peak_tflops",
                                  cfg.source, backend.device().name(), known_gpu_names()));
    }
  }
  if (gpu) return {gpu->bf16_tflops, "GPU bf16"};
  return {measure_fp32_peak_gflops(0.3) / 1000.0, "measured fp32"};
}

std::string model_line(const RunConfig& cfg, int64_t padded_vocab) {
  const ModelConfig& m = cfg.model;
  return fmt::format("model {}: {} layers, d_model {}, {} heads, ffn {}, vocab {} (padded {}), "
                     "context {}; {:.2f}M parameters",
                     m.name, m.layers, m.d_model, m.heads, m.ffn_dim(), m.vocab, padded_vocab,
                     m.context, static_cast<double>(parameter_count(m)) / 1e6);
}

std::string layout_line(const RunConfig& cfg, const StageBytes& bytes, const std::string& backend,
                        const Peak& peak) {
  const Layout& l = cfg.parallel;
  return fmt::format("layout tp {} x pp {} x dp {} on {} ranks{}{}, recompute {}; {} {}; memory "
                     "per rank: weights+grads {}, optimizer {}{}, activations {}; peak {:.3f} TFLOP/s ({})",
                     l.tp, l.pp, l.dp, l.world_size(), l.zero1_active() ? ", ZeRO-1" : "",
                     l.sequence_parallel_active() ? ", sequence parallel" : "",
                     to_string(l.recompute), backend, to_string(cfg.train.precision),
                     human_bytes(bytes.params, 1), human_bytes(bytes.optimizer, 1),
                     cfg.train.precision == Precision::bf16 ? " (fp32 master + Adam)" : " (Adam)",
                     human_bytes(bytes.activations, 1), peak.tflops, peak.source);
}

std::string pipeline_line(const RunConfig& cfg, const StagePlan& plan) {
  const Layout& l = cfg.parallel;
  std::string split;
  for (int64_t n : plan.layers.per_stage) split += fmt::format("{}{}", split.empty() ? "" : " ", n);
  return fmt::format("pipeline: {} stages, layers per stage {} (embedding and head counted as "
                     "{:.2f} layers{}), {}, {} microbatches per step",
                     l.pp, split,
                     static_cast<double>(cfg.model.padded_vocab()) / (12.0 * cfg.model.d_model),
                     l.stage_layers.empty() ? "" : "; given by parallel.stage_layers",
                     l.virtual_stages > 1
                         ? fmt::format("interleaved 1F1B with {} chunks per rank", l.virtual_stages)
                         : "1F1B",
                     plan.microbatches);
}

}  // namespace jumbo
