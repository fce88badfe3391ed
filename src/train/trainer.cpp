#include "jumbo/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "jumbo/comm/watchdog.h"
#include "jumbo/model/flops.h"
#include "jumbo/obs/memory.h"
#include "jumbo/train/device.h"
#include "jumbo/train/stop_signal.h"

namespace jumbo {

Trainer::Trainer(const RunConfig& cfg, Backend& backend, std::shared_ptr<Comm> world)
    : cfg_(validated_for_world(cfg, world->size())),
      backend_(backend),
      world_(world),
      grid_(world, static_cast<int>(cfg_.parallel.tp), static_cast<int>(cfg_.parallel.pp)),
      groups_(process_groups(grid_)),
      plan_(plan_stage(cfg_, grid_.coords())),
      // Before anything is allocated: a layout that cannot fit on train.gpu stops here.
      planned_(plan_memory(cfg_)),
      anomalies_(cfg_.train),
      faults_(FaultInjection::from_environment()) {
  check_device_supports(cfg_, plan_.model, backend_.device().kind());
  if (world_->size() > 1) start_comm_watchdog(cfg_.parallel.comm_timeout_s);
  // The network NCCL chose on every rank, from its log, before anything is allocated.
  if (const std::string net = require_nccl_network(cfg_, backend_, *world_); !net.empty())
    print(net);
  if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));
  data_ = std::make_unique<RunData>(cfg_, grid_.dp_rank());  // a mismatch fails here, early

  model_ = std::make_unique<GptModel>(cfg_.model, plan_.model, backend_, groups_.tp);
  model_->initialize(cfg_.train.seed);
  grad_sync_ = std::make_unique<GradSync>(model_->params(), groups_, plan_);
  optimizer_ = std::make_unique<AdamW>(model_->params(), backend_, cfg_.train, plan_);
  pipeline_ = std::make_unique<PipelineRunner>(*model_, groups_.pp, plan_);
  step_parts_.reset(new StepParts{*model_, *pipeline_, *grad_sync_, *optimizer_, groups_});

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
    stragglers_ = std::make_unique<StragglerDetector>(*world_, grid_.pp_rank(), cfg_.log.straggler_ratio,
                                                      cfg_.log.straggler_intervals);
  }
  print_start();
  if (!cfg_.checkpoint.dir.empty() || cfg_.checkpoint.resume != "none") {
    checkpointer_ = std::make_unique<Checkpointer>(cfg_, *world_);
    check_checkpoint_room_at_start();
    resume_from_checkpoint();
  }
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
  print(model_line(cfg_, model_->padded_vocab()));
  const StageBytes bytes{static_cast<double>(model_->params().bytes()),
                         static_cast<double>(optimizer_->state_bytes()),
                         static_cast<double>(model_->activation_bytes())};
  print(layout_line(cfg_, bytes, backend_.device().name(), peak_));
  if (cfg_.parallel.pp > 1) print(pipeline_line(cfg_, plan_));
  if (world_->size() > 1) print(placement_line(grid_));
  print(data_->describe());
  if (!faults_.empty()) print(faults_.describe());
}

void Trainer::evaluate(StepMetrics& m) {
  grad_sync_->wait_for_weights();  // the forward-only runs read every weight
  double mean = 0;
  for (ValidSet& set : data_->valid()) {
    set.batches->start_step(0);
    PipelineRun run;
    run.mode = PipelineMode::forward_only;
    run.microbatches = plan_.eval_microbatches;
    double sum = pipeline_->run(*set.batches, run);
    sum = groups_.dp.all_reduce_scalar(sum, ReduceOp::sum);
    sum = groups_.pp.all_reduce_scalar(sum, ReduceOp::sum);  // only the last stage has it
    const double loss = sum / static_cast<double>(cfg_.train.eval_batches *
                                                  cfg_.parallel.micro_batch * cfg_.model.context);
    m.val_losses.emplace_back(set.name, loss);
    mean += set.weight * loss;
  }
  m.val_loss = data_->valid().empty() ? NAN : mean;
}

void Trainer::collect_comm_bytes(StepMetrics& m) {
  m.comm_bytes = {{"tp", groups_.tp.bytes_sent()}, {"dp", groups_.dp.bytes_sent()},
                  {"pp", groups_.pp.bytes_sent()}, {"embedding", groups_.embedding.bytes_sent()}};
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

TrainSummary Trainer::run() {
  using clock = std::chrono::steady_clock;
  struct DenormalScope {
    Backend& b;
    explicit DenormalScope(Backend& backend) : b(backend) { b.set_flush_denormals(true); }
    ~DenormalScope() { b.set_flush_denormals(false); }
  } denormals(backend_);
  TrainSummary summary;
  const int64_t steps = cfg_.train.steps, seq = cfg_.model.context;
  const int64_t pp = cfg_.parallel.pp;
  const int64_t slow_ms = faults_.slow_ms(world_->rank());
  double time_spent = 0;
  int64_t steps_timed = 0;
  double interval_compute_s = 0, interval_wait_s = 0;  // this rank's, for the straggler report
  summary.first_step = step_ + 1;
  summary.steps = step_;
  for (int64_t step = step_ + 1; step <= steps;) {
    const auto t0 = clock::now();
    if (checkpointer_) checkpointer_->poll();
    const int64_t batch = ramp_->at(consumed_tokens_);
    const int64_t batch_tokens = batch * seq;
    const double lr = lr_->at(consumed_tokens_ + batch_tokens);
    const int64_t first_sample = consumed_samples_;
    data_->train().start_step(first_sample);
    if (cfg_.log.comm) {
      for (Comm* c : {&groups_.tp, &groups_.dp, &groups_.pp, &groups_.embedding}) c->reset_bytes();
    }
    const int64_t micro_steps = batch / (cfg_.parallel.micro_batch * cfg_.parallel.dp);
    if (cfg_.parallel.virtual_stages > 1 && micro_steps % pp != 0) {
      throw UserError(fmt::format("step {}: {} microbatches (batch ramp-up) is not a multiple "
                                  "of parallel.pp = {}, which interleaving needs",
                                  step, micro_steps, pp));
    }
    StepRequest request{.microbatches = micro_steps, .batch_tokens = batch_tokens, .lr = lr,
                        .grad_clip = cfg_.train.grad_clip};
    // Every rank holds the same loss and grad norm here, so every rank decides alike.
    AnomalyVerdict verdict;
    request.apply_update = [this, &verdict](const StepResult& r) {
      verdict = anomalies_.check(r.loss, r.grad_norm);
      return !verdict.kind;
    };
    if (faults_.nan_in(first_sample, first_sample + batch)) {
      request.before_grad_norm = [this](Tensor grads) { poison_with_nan(backend_, grads); };
    }
    ScrambledTargets scrambled(data_->train(), cfg_.model.vocab, cfg_.parallel.micro_batch * seq);
    MicrobatchSource& source = faults_.spike_in(first_sample, first_sample + batch)
                                   ? static_cast<MicrobatchSource&>(scrambled)
                                   : data_->train();

    const double wait_before = comm_wait_seconds();
    const auto compute_start = clock::now();
    if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    const StepResult r = train_step(*step_parts_, source, request);
    const double waited = comm_wait_seconds() - wait_before;
    interval_wait_s += waited;
    interval_compute_s += std::chrono::duration<double>(clock::now() - compute_start).count() - waited;

    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    if (r.applied) {
      anomalies_.accept(r.loss);
      consumed_samples_ += batch;
      consumed_tokens_ += batch_tokens;
    }
    time_spent += dt;
    ++steps_timed;

    StepMetrics m;
    m.step = step;
    m.total_steps = steps;
    m.loss = r.loss;
    m.lr = lr;
    m.grad_norm = r.grad_norm;
    m.global_batch = batch;
    m.tokens = consumed_tokens_;
    m.step_time_s = dt;
    m.tokens_per_s = static_cast<double>(batch_tokens) / dt;
    m.tflops_per_device = model_flops_per_iteration(cfg_.model, batch, seq) / dt /
                          static_cast<double>(world_->size()) / 1e12;
    m.mfu = m.tflops_per_device / peak_.tflops;
    m.mem_peak_bytes = peak_rss_bytes();
    m.eta_s = time_spent / static_cast<double>(steps_timed) * static_cast<double>(steps - step);
    const bool interval = step % cfg_.log.every == 0 || step == steps || step == 1;
    if (stragglers_ && step % cfg_.log.every == 0) {
      m.ranks = stragglers_->gather(interval_compute_s, interval_wait_s);
      interval_compute_s = interval_wait_s = 0;
    }
    if (!r.applied) {
      // Stops (logged, then thrown), skips, or rewinds; m says which.
      const int64_t next = handle_anomaly(m, verdict, first_sample, batch, summary);
      if (next <= step) {  // a rewind: the steps from the checkpoint on run again
        log_step(m, true);
        step = next;
        continue;
      }
    }
    if (cfg_.train.eval_every > 0 && (step % cfg_.train.eval_every == 0 || step == steps)) {
      evaluate(m);
      summary.final_val_loss = m.val_loss;
    }
    if (cfg_.log.comm) collect_comm_bytes(m);
    log_step(m, interval || m.val_loss.has_value());
    summary.losses.push_back(r.loss);
    summary.final_loss = r.loss;
    summary.steps = step;
    step_ = step;
    if (checkpointer_ && checkpointer_->due(step, steps) && !save_checkpoint(step, lr, batch)) {
      summary.stop_no_room = true;
      break;
    }
    // Every rank stops after the same step: the first signal any of them got decides.
    const int signal = static_cast<int>(
        world_->all_reduce_scalar(static_cast<double>(stop_signal_received()), ReduceOp::max));
    if (signal != 0 && step < steps) {
      stop_for_signal(summary, signal, step, lr, batch);
      break;
    }
    ++step;
  }
  summary.anomalies = anomalies_.progress().skipped;
  if (checkpointer_) checkpointer_->wait();
  grad_sync_->wait_for_weights();  // the model's weights are whole when run() returns
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
  return summary;
}

}  // namespace jumbo
