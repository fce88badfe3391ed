#include "jumbo/bench/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/watchdog.h"
#include "jumbo/config/gpus.h"
#include "jumbo/model/flops.h"
#include "jumbo/model/init.h"
#include "jumbo/runtime/peak.h"
#include "jumbo/parallel/rank_stage.h"
#include "jumbo/plan/search.h"
#include "jumbo/runtime/device.h"
#include "jumbo/train/step.h"
#include "jumbo/train/train_stage.h"

namespace jumbo {
namespace {

// Synthetic tokens from the counter generator: deterministic, no data files needed.
// `stream` tells data-parallel ranks apart; the tp and pp ranks of one replica draw alike.
class SyntheticBatches final : public MicrobatchSource {
 public:
  SyntheticBatches(int64_t n, int64_t vocab, uint64_t stream = 11)
      : n_(n), vocab_(vocab), stream_(stream) {}
  void next(const MicrobatchView& mb) override {
    int32_t *tokens = mb.tokens, *targets = mb.targets;
    for (int64_t i = 0; i < n_; ++i) {
      const float u = counter_normal(7, stream_, static_cast<uint64_t>(calls_ * n_ + i));
      tokens[i] = static_cast<int32_t>(static_cast<int64_t>(std::abs(u) * 1e6) % vocab_);
      targets[i] = static_cast<int32_t>((tokens[i] * 31 + 7) % vocab_);
    }
    ++calls_;
  }

 private:
  int64_t n_, vocab_;
  uint64_t stream_;
  int64_t calls_ = 0;
};

}  // namespace

TrainBenchResult bench_train(const ModelConfig& model, const TrainBenchOptions& opts,
                             Backend& backend) {
  ModelConfig m = model;
  if (opts.seq > m.context) m.context = opts.seq;
  // One rank (each process of an mpirun measures alone).
  Layout layout;
  layout.micro_batch = opts.micro_batch;
  layout.device = opts.device;
  const StepShape shape{.global_batch = opts.micro_batch * opts.micro_steps, .seq = opts.seq,
                        .precision = opts.precision};
  TrainConfig train;
  train.seed = 1234;
  TrainStage solo = solo_train_stage(m, layout, shape, train, backend);
  SyntheticBatches source(opts.micro_batch * opts.seq, m.vocab);
  const int64_t batch_tokens = opts.micro_batch * opts.micro_steps * opts.seq;

  TrainBenchResult r;
  if (opts.peak_tflops > 0) {
    r.peak_tflops = opts.peak_tflops;
  } else if (backend.device().kind() == Device::cuda) {
    const GpuSpec* gpu =
        gpu_from_device_name(backend.device().name(), backend.device().memory().total);
    if (!gpu) {
      throw UserError(fmt::format("bench train: {} is not a GPU jumbo knows the peak of: give "
                                  "--peak-tflops", backend.device().name()));
    }
    r.peak_tflops = gpu->bf16_tflops;
  } else {
    r.peak_tflops = measure_fp32_peak_gflops(0.5) / 1e3;
  }
  std::vector<double> times;
  backend.set_flush_denormals(true);  // as the trainer's step loop
  for (int64_t s = 0; s < opts.warmup_steps + opts.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult sr = train_step(solo, source, {.microbatches = opts.micro_steps,
                                                    .loss_tokens = batch_tokens,
                                                    .lr = 1e-4,
                                                    .grad_clip = 1.0});
    backend.stream().synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) r.loss_first = sr.loss;
    r.loss_last = sr.loss;
    if (s >= opts.warmup_steps) times.push_back(dt);
  }
  backend.set_flush_denormals(false);
  std::sort(times.begin(), times.end());
  r.step_time_s = times[times.size() / 2];
  r.flops_per_step = model_flops_per_iteration(m, opts.micro_batch * opts.micro_steps, opts.seq);
  r.tokens_per_s = static_cast<double>(batch_tokens) / r.step_time_s;
  r.model_tflops = r.flops_per_step / r.step_time_s / 1e12;
  r.mfu = r.model_tflops / r.peak_tflops;
  r.parameters = parameter_count(m);
  return r;
}

std::string describe(const TrainBenchResult& r, const ModelConfig& m,
                     const TrainBenchOptions& o) {
  return fmt::format(
      "bench train {}: {:.1f}M params, micro batch {} x seq {} x {} microbatches, {}\n"
      "  step (fwd+bwd+AdamW) {:.3f} s (median of {}), {:.0f} tokens/s\n"
      "  model FLOPs/step {:.1f} GFLOP = {}\n"
      "  achieved {:.1f} GFLOP/s of peak {:.1f} GFLOP/s ({}): MFU {:.1f}%\n"
      "  loss {:.3f} -> {:.3f}",
      m.name, static_cast<double>(r.parameters) / 1e6, o.micro_batch, o.seq, o.micro_steps,
      to_string(o.precision), r.step_time_s, o.steps, r.tokens_per_s, r.flops_per_step / 1e9,
      kModelFlopsFormula, r.model_tflops * 1e3, r.peak_tflops * 1e3,
      o.peak_tflops > 0 ? "given" : o.device == Device::cuda ? "the GPU's bf16 dense peak" : "measured fp32 FMA peak", r.mfu * 100, r.loss_first,
      r.loss_last);
}

namespace {

// The plan's request for a run config, as `jumbo plan --config CONFIG --gpu G --nodes N
// --gpus-per-node P` builds it (src/cli/verb_plan.cpp): the model, global batch and precision
// of the config, sequence = model.context, the GPU time model.
PlanRequest plan_request_of(const RunConfig& cfg, const GpuSpec& gpu, int64_t nodes,
                            int64_t gpus_per_node) {
  PlanRequest r;
  r.model = cfg.model;
  r.set_gpu(gpu, gpus_per_node);
  r.nodes = nodes;
  r.target.device = PlanDevice::gpu;
  r.target.precision = cfg.train.precision;
  r.target.global_batch = cfg.train.global_batch;
  return r;
}

}  // namespace

PlanCandidate planned_step(const RunConfig& cfg, const GpuSpec& gpu, int64_t nodes,
                           int64_t gpus_per_node) {
  return evaluate_layout(plan_request_of(cfg, gpu, nodes, gpus_per_node), cfg.parallel);
}

PlanCandidate planned_step(const RunConfig& cfg, const Machine& machine, int64_t nodes) {
  PlanRequest r = plan_request_of(cfg, *find_gpu("a100-40gb"), nodes, machine.ranks_per_host);
  r.set_machine(machine);
  if (machine.device == Device::cpu) r.target.device = PlanDevice::cpu;
  return evaluate_layout(r, cfg.parallel);
}

std::string layout_token(const Layout& l) {
  return fmt::format("tp{},pp{},dp{},mb{},vs{},recompute={},zero1={},sp={}", l.tp, l.pp, l.dp,
                     l.micro_batch, l.virtual_stages, to_string(l.recompute),
                     l.zero1_active() ? 1 : 0, l.sequence_parallel_active() ? 1 : 0);
}

RunBenchResult bench_run(const RunConfig& config, const RunBenchOptions& opts, Backend& backend,
                         std::shared_ptr<Comm> world) {
  const int world_size = world->size();
  const int64_t per_node = opts.gpus_per_node > 0 ? opts.gpus_per_node
                                                  : world_size / std::max<int64_t>(opts.nodes, 1);
  if (opts.nodes < 1 || per_node < 1 || opts.nodes * per_node != world_size) {
    throw UserError(fmt::format("bench train: --nodes {} x --gpus-per-node {} is not the {} "
                                "ranks of this launch", opts.nodes, per_node, world_size));
  }
  const std::string gpu_name = !opts.gpu.empty()          ? opts.gpu
                               : !config.train.gpu.empty() ? config.train.gpu
                                                          : "a100-40gb";
  const GpuSpec* gpu = find_gpu(gpu_name);
  if (!gpu) {
    throw UserError(fmt::format("bench train: --gpu {}: expected one of {}", gpu_name,
                                known_gpu_names()));
  }
  // What `jumbo train` builds (Trainer's constructor) less the data, metrics and checkpoints.
  const RunConfig cfg = validated_for_world(config, world_size);
  RankStage place(world, cfg);
  check_device_supports(cfg, place.options(), backend.device().kind());
  if (world_size > 1) start_comm_watchdog(cfg.parallel.comm_timeout_s);
  RunBenchResult r;
  // The network NCCL chose on every rank, refused as `jumbo train` refuses it:
  // a preflight on sockets where EFA is expected (comm.expect_network) fails here.
  r.network_line = require_nccl_network(cfg, backend, *world);
  const int dp_rank = place.grid().dp_rank();
  TrainStage stage(std::move(place), cfg.model, cfg.train, backend);

  const int64_t seq = cfg.model.context, batch = cfg.train.global_batch;
  const int64_t micro_steps = batch / (cfg.parallel.micro_batch * cfg.parallel.dp);
  SyntheticBatches source(cfg.parallel.micro_batch * seq, cfg.model.vocab,
                          100 + static_cast<uint64_t>(dp_rank));
  r.layout = cfg.parallel;
  r.device = backend.device().kind();
  r.world = world_size;
  r.gpu = gpu_name;
  backend.set_flush_denormals(true);  // as the trainer's step loop
  for (int64_t s = 0; s < opts.warmup_steps + opts.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult sr = train_step(stage, source, {.microbatches = micro_steps,
                                                     .loss_tokens = batch * seq,
                                                     .lr = cfg.train.lr,
                                                     .grad_clip = cfg.train.grad_clip});
    backend.stream().synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The step is as long as its slowest rank (the next step's collectives wait for it).
    const double slowest = world->all_reduce_scalar(dt, ReduceOp::max);
    if (s == 0) r.loss_first = sr.loss;
    r.loss_last = sr.loss;
    if (s >= opts.warmup_steps) r.step_times_s.push_back(slowest);
  }
  backend.set_flush_denormals(false);
  stage.grad_sync().wait_for_weights();
  std::vector<double> sorted = r.step_times_s;
  std::sort(sorted.begin(), sorted.end());
  r.step_time_s = sorted[sorted.size() / 2];
  if (!opts.machine.empty() || r.device == Device::cuda) {
    const PlanCandidate c = opts.machine.empty()
                                ? planned_step(cfg, *gpu, opts.nodes, per_node)
                                : planned_step(cfg, load_machine(opts.machine), opts.nodes);
    r.has_plan = true;
    r.plan_step_time_s = c.step_time_s;
    r.plan_terms = describe_time_terms(c);
    if (!opts.machine.empty()) r.gpu = opts.machine;
  }
  return r;
}

std::string describe(const RunBenchResult& r, const RunConfig& cfg, const RunBenchOptions& o) {
  std::string times;
  for (double t : r.step_times_s) times += fmt::format("{}{:.3f}", times.empty() ? "" : " ", t);
  std::string out = fmt::format(
      "bench train {} ({}): layout {} on {} ranks, {}; global batch {} x seq {}, synthetic tokens\n"
      "  step (fwd+bwd+AdamW, slowest rank) {:.3f} s median of {} after {} warmup: {} s\n"
      "  loss {:.3f} -> {:.3f}\n",
      cfg.model.name, cfg.source, r.layout.describe(), r.world, to_string(r.device),
      cfg.train.global_batch, cfg.model.context, r.step_time_s, o.steps, o.warmup_steps, times,
      r.loss_first, r.loss_last);
  if (!r.network_line.empty()) out += fmt::format("  {}\n", r.network_line);
  if (r.has_plan) {
    out += fmt::format("  plan for {} (docs/plan.md, time model): {:.3f} s = {}\n", r.gpu,
                       r.plan_step_time_s, r.plan_terms);
    out += fmt::format("preflight: step measured={:.4f}s plan={:.4f}s ratio={:.3f} layout={} "
                       "device={} gpu={} ranks={}",
                       r.step_time_s, r.plan_step_time_s, r.step_time_s / r.plan_step_time_s,
                       layout_token(r.layout), to_string(r.device), r.gpu, r.world);
  } else {
    out += fmt::format("preflight: step measured={:.4f}s plan=na ratio=na layout={} device={} "
                       "ranks={} (a CPU run is estimated on a measured machine: --machine FILE "
                       "from jumbo bench comm --write-machine)",
                       r.step_time_s, layout_token(r.layout), to_string(r.device), r.world);
  }
  return out;
}

}  // namespace jumbo
