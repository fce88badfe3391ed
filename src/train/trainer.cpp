#include "jumbo/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <utility>

#include "jumbo/comm/agreed_error.h"
#include "jumbo/comm/watchdog.h"
#include "jumbo/model/flops.h"
#include "jumbo/obs/memory.h"
#include "jumbo/runtime/device.h"
#include "jumbo/runtime/stop_signal.h"

namespace jumbo {

Trainer::Trainer(const RunConfig& cfg, Backend& backend, std::shared_ptr<Comm> world)
    : cfg_(validated_for_world(cfg, world->size())),
      backend_(backend),
      world_(world),
      // Before anything is allocated: a layout that cannot fit on train.gpu stops here.
      planned_(plan_memory(cfg_)),
      anomalies_(cfg_.train),
      faults_(FaultInjection::from_environment(), backend, world->rank(), cfg_.model.vocab,
              cfg_.parallel.micro_batch * cfg_.model.context) {
  RankStage place(world_, cfg_);
  check_device_supports(cfg_, place.options(), backend_.device().kind());
  if (world_->size() > 1) start_comm_watchdog(cfg_.parallel.comm_timeout_s);
  // The network NCCL chose on every rank, from its log, before anything is allocated.
  if (const std::string net = require_nccl_network(cfg_, backend_, *world_); !net.empty())
    print(net);
  if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));
  data_ = std::make_unique<RunData>(cfg_, place.grid().dp_rank());  // a mismatch fails here, early
  stage_ = std::make_unique<TrainStage>(std::move(place), cfg_.model, cfg_.train, backend_);

  const int64_t dp = cfg_.parallel.dp;
  const int64_t decay = cfg_.train.decay_tokens > 0 ? cfg_.train.decay_tokens
                                                    : total_run_tokens(cfg_, dp);
  lr_ = std::make_unique<LrSchedule>(cfg_.train, decay);
  ramp_ = std::make_unique<BatchRamp>(cfg_.train, cfg_.parallel.micro_batch * dp);
  if (world_->rank() == 0) metrics_ = std::make_unique<MetricsLog>(cfg_.log.metrics_file);
  if (world_->rank() == 0 && (!cfg_.log.emf_file.empty() || !cfg_.log.emf_address.empty())) {
    emf_ = std::make_unique<EmfLog>(cfg_.log, emf_run_name(cfg_),
                                    emf_layout(cfg_.parallel.tp, cfg_.parallel.pp, dp));
  }
  peak_ = run_peak(cfg_, backend_);
  if (world_->size() > 1) {
    stragglers_ = std::make_unique<StragglerDetector>(*world_, stage_->grid().pp_rank(), cfg_.log.straggler_ratio,
                                                      cfg_.log.straggler_intervals);
  }
  print_start();
  if (!cfg_.checkpoint.dir.empty() || cfg_.checkpoint.resume != "none") {
    checkpointer_ = std::make_unique<Checkpointer>(cfg_, *world_);
    check_checkpoint_room_at_start();
    if (resume_from_checkpoint()) return;  // a resumed fine-tune goes on from its own weights
  }
  if (!cfg_.train.init_from.empty()) init_from_checkpoint();
}

Trainer::~Trainer() = default;

void Trainer::print(const std::string& line) const {
  if (world_->rank() == 0) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
}

void Trainer::print_start() {
  if (!planned_.fit_line.empty()) print(planned_.fit_line);
  const ModelStage& model = stage_->model();
  print(model_line(cfg_, model.padded_vocab()));
  const StageBytes bytes{static_cast<double>(model.params().bytes() + (model.lora() ? model.trained_params().bytes() : 0)),
                         static_cast<double>(stage_->optimizer().state_bytes()),
                         static_cast<double>(model.activation_bytes())};
  print(layout_line(cfg_, bytes, backend_.device().name(), peak_));
  if (cfg_.parallel.pp > 1) print(pipeline_line(cfg_, stage_->plan()));
  if (world_->size() > 1) print(placement_line(stage_->grid()));
  print(data_->describe());
  if (!faults_.injected().empty()) print(faults_.injected().describe());
}

void Trainer::evaluate(StepMetrics& m) {
  stage_->grad_sync().wait_for_weights();  // the forward-only runs read every weight
  const ProcessGroups& groups = stage_->groups();
  double mean = 0;
  for (ValidSet& set : data_->valid()) {
    set.batches->start_step(0);
    PipelineRun run;
    run.mode = PipelineMode::forward_only;
    run.microbatches = stage_->plan().eval_microbatches;
    double sum = stage_->pipeline().run(*set.batches, run);
    sum = groups.dp.all_reduce_scalar(sum, ReduceOp::sum);
    sum = groups.pp.all_reduce_scalar(sum, ReduceOp::sum);  // only the last stage has it
    const int64_t counted =
        set.batches->loss_tokens(0, cfg_.train.eval_batches * cfg_.parallel.micro_batch);
    const double loss = sum / static_cast<double>(std::max<int64_t>(1, counted));
    m.val_losses.emplace_back(set.name, loss);
    mean += set.weight * loss;
  }
  m.val_loss = data_->valid().empty() ? NAN : mean;
}

void Trainer::collect_comm_bytes(StepMetrics& m) {
  const ProcessGroups& g = stage_->groups();
  m.comm_bytes = {{"tp", g.tp.bytes_sent()}, {"dp", g.dp.bytes_sent()},
                  {"pp", g.pp.bytes_sent()}, {"embedding", g.embedding.bytes_sent()}};
}

void Trainer::log_step(StepMetrics& m, bool interval) {
  if (metrics_) metrics_->write(m);
  if (interval || m.anomaly) {
    print(human_line(m));
    if (m.anomaly) print(anomaly_line(m));
    if (m.ranks) {
      for (const std::string& line : rank_times_lines(*m.ranks, cfg_.log.straggler_ratio)) print(line);
    }
    if (emf_) emf_->write(m);
  }
}

namespace {
// Denormal floats flushed to zero while the run's steps compute (they are slow on CPUs).
struct FlushDenormals {
  Backend& backend;
  explicit FlushDenormals(Backend& b) : backend(b) { backend.set_flush_denormals(true); }
  ~FlushDenormals() { backend.set_flush_denormals(false); }
};
}  // namespace

TrainSummary Trainer::run() {
  const FlushDenormals denormals(backend_);
  const int64_t steps = cfg_.train.steps;
  TrainSummary summary;
  summary.first_step = progress_.step + 1;
  summary.steps = progress_.step;
  StepMeter meter(steps, world_->size(), peak_.tflops);
  while (progress_.step < steps) {
    const int64_t step = progress_.step + 1;
    StepOutcome s = train_one_step(step, meter);
    if (!s.result.applied && handle_anomaly(s, summary) == AfterAnomaly::rewound) {
      log_step(s.metrics, true);
      continue;  // the steps from the checkpoint on run again
    }
    if (cfg_.train.eval_every > 0 && (step % cfg_.train.eval_every == 0 || step == steps)) {
      evaluate(s.metrics);
      summary.final_val_loss = s.metrics.val_loss;
    }
    if (cfg_.log.comm) collect_comm_bytes(s.metrics);
    const bool interval = step % cfg_.log.every == 0 || step == steps || step == 1;
    log_step(s.metrics, interval || s.metrics.val_loss.has_value());
    summary.record_step(step, s.result.loss);
    progress_.step = step;
    if (checkpointer_ && checkpointer_->due(step, steps) &&
        !save_checkpoint(s.metrics.lr, s.batch)) {
      summary.stop_no_room = true;
      break;
    }
    if (stop_on_signal(summary, s.metrics.lr, s.batch)) break;
  }
  finish_run(summary);
  return summary;
}

Trainer::StepOutcome Trainer::train_one_step(int64_t step, StepMeter& meter) {
  meter.start_step();
  if (checkpointer_) checkpointer_->poll();
  StepOutcome s;
  s.batch = ramp_->at(progress_.consumed_tokens);
  s.first_sample = progress_.consumed_samples;
  const int64_t seq = cfg_.model.context, pp = cfg_.parallel.pp;
  const int64_t batch_tokens = s.batch * seq;
  const double lr = lr_->at(progress_.consumed_tokens + batch_tokens);
  data_->train().start_step(s.first_sample);
  if (cfg_.log.comm) {
    const ProcessGroups& g = stage_->groups();
    for (Comm* c : {&g.tp, &g.dp, &g.pp, &g.embedding}) c->reset_bytes();
  }
  const int64_t micro_steps = s.batch / (cfg_.parallel.micro_batch * cfg_.parallel.dp);
  if (cfg_.parallel.virtual_stages > 1 && micro_steps % pp != 0) {
    // The batch schedule is every rank's: every rank stops here alike (the last step's weight
    // gather still running: GradSync's destructor waits for it).
    throw AgreedError(fmt::format("step {}: {} microbatches (batch ramp-up) is not a multiple "
                                  "of parallel.pp = {}, which interleaving needs",
                                  step, micro_steps, pp),
                      world_->rank() != 0);
  }
  StepRequest request{.microbatches = micro_steps,
                      .loss_tokens = data_->train().loss_tokens(s.first_sample, s.batch),
                      .lr = lr, .grad_clip = cfg_.train.grad_clip,
                      .dropout_seed = derive_seed(cfg_.train.seed, static_cast<uint64_t>(step))};
  // Every rank holds the same loss and grad norm here, so every rank decides alike.
  request.apply_update = [this, &s](const StepResult& r) {
    s.verdict = anomalies_.check(r.loss, r.grad_norm);
    return !s.verdict.kind;
  };
  MicrobatchSource& source =
      faults_.apply(request, data_->train(), s.first_sample, s.first_sample + s.batch);
  meter.start_compute();
  faults_.slow_down();
  s.result = train_step(*stage_, source, request);
  meter.end_compute();
  if (s.result.applied) {
    anomalies_.accept(s.result.loss);
    progress_.consumed_samples += s.batch;
    progress_.consumed_tokens += batch_tokens;
  }
  StepMetrics& m = s.metrics;
  m.step = step;
  m.loss = s.result.loss;
  m.lr = lr;
  m.grad_norm = s.result.grad_norm;
  m.global_batch = s.batch;
  m.tokens = progress_.consumed_tokens;
  meter.finish_step(m, batch_tokens, model_flops_per_iteration(cfg_.model, s.batch, seq));
  if (stragglers_ && step % cfg_.log.every == 0) {
    const auto [compute_s, wait_s] = meter.take_interval();
    m.ranks = stragglers_->gather(compute_s, wait_s);
  }
  return s;
}

void Trainer::finish_run(TrainSummary& summary) {
  summary.anomalies = anomalies_.progress().skipped;
  if (checkpointer_) checkpointer_->wait();
  stage_->grad_sync().wait_for_weights();  // the model's weights are whole when run() returns
  // On a GPU: device memory in use (arenas are allocated once, so this is the peak) against
  // the plan's GPU model; on the CPU: the peak resident set against its CPU model.
  const bool on_gpu = backend_.device().kind() == Device::cuda;
  summary.planned_bytes = on_gpu ? planned_.gpu_bytes : planned_.cpu_bytes;
  const double measured = on_gpu ? static_cast<double>(backend_.device().memory().used)
                                 : static_cast<double>(peak_rss_bytes());
  summary.measured_peak_bytes =
      static_cast<uint64_t>(world_->all_reduce_scalar(measured, ReduceOp::max));
  print(fmt::format("memory per rank: planned {} (fullest stage, docs/plan.md), measured {} {} "
                    "(largest over ranks): {:+.1f}%",
                    human_bytes(summary.planned_bytes, 2), on_gpu ? "device memory" : "peak",
                    human_bytes(static_cast<double>(summary.measured_peak_bytes), 2),
                    100.0 * (static_cast<double>(summary.measured_peak_bytes) /
                                 summary.planned_bytes - 1.0)));
}

}  // namespace jumbo
