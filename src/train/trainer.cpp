#include "jumbo/train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "jumbo/comm/watchdog.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/model/flops.h"
#include "jumbo/obs/memory.h"
#include "jumbo/obs/peak.h"
#include "jumbo/config/gpus.h"
#include "jumbo/plan/search.h"
#include "jumbo/train/stop_signal.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/model/stages.h"

namespace jumbo {
namespace {
// Validates before the grid is built, so a layout that does not fit fails with one line.
const RunConfig& validated(const RunConfig& cfg, int world_size) {
  validate(cfg, world_size);
  return cfg;
}

PlanLayout plan_layout_of(const RunConfig& cfg, int64_t dp) {
  PlanLayout l;
  l.tp = cfg.parallel.tp;
  l.pp = cfg.parallel.pp;
  l.dp = dp;
  l.micro_batch = cfg.parallel.micro_batch;
  l.recompute = cfg.parallel.recompute;
  l.zero1 = cfg.parallel.zero1;
  l.sequence_parallel = cfg.parallel.sequence_parallel;
  l.virtual_stages = cfg.parallel.virtual_stages;
  l.stage_layers = cfg.parallel.stage_layers;
  return l;
}

PlanTarget plan_target_of(const RunConfig& cfg, PlanDevice device) {
  PlanTarget t;
  t.device = device;
  t.precision = cfg.train.precision;
  t.global_batch = cfg.train.global_batch;
  t.seq = cfg.model.context;
  t.bucket_size = cfg.parallel.bucket_size;
  return t;
}
}  // namespace

Trainer::Trainer(const RunConfig& cfg, Backend& backend, std::shared_ptr<Comm> world)
    : cfg_(validated(cfg, world->size())),
      backend_(backend),
      world_(world),
      grid_(world, static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.pp)),
      seq_(cfg.model.context) {
  const int dp = grid_.dp_size(), dp_rank = grid_.dp_rank();
  // Before anything is allocated: a layout that cannot fit on train.gpu stops here.
  check_planned_memory();
  if (world_->size() > 1) start_comm_watchdog(cfg_.parallel.comm_timeout_s);
  if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));

  // Data first: a mismatch should fail before gigabytes are allocated.
  const Tokenizer tokenizer(cfg_.data.tokenizer);
  if (tokenizer.vocab_size() > cfg_.model.vocab) {
    throw UserError(fmt::format("{}: model.vocab = {} is smaller than the vocabulary of "
                                "data.tokenizer = {} ({} pieces)",
                                cfg_.source, cfg_.model.vocab, cfg_.data.tokenizer,
                                tokenizer.vocab_size()));
  }
  train_data_ = std::make_unique<IndexedDataset>(cfg_.data.train);
  train_data_->check_tokenizer(tokenizer.vocab_size(), tokenizer.fingerprint(), tokenizer.path());
  train_sampler_ = std::make_unique<GptSampler>(*train_data_, seq_, cfg_.train.seed, true);
  const int64_t mb = cfg_.parallel.micro_batch;
  train_batches_ = std::make_unique<DatasetBatches>(*train_sampler_, mb, seq_, dp_rank, dp);
  if (!cfg_.data.valid.empty()) {
    valid_data_ = std::make_unique<IndexedDataset>(cfg_.data.valid);
    valid_data_->check_tokenizer(tokenizer.vocab_size(), tokenizer.fingerprint(),
                                 tokenizer.path());
    valid_sampler_ = std::make_unique<GptSampler>(*valid_data_, seq_, cfg_.train.seed, false);
    valid_batches_ = std::make_unique<DatasetBatches>(*valid_sampler_, mb, seq_, dp_rank, dp);
  }

  GptOptions opts;
  opts.micro_batch = mb;
  opts.seq = seq_;
  const int pp = grid_.pp_size(), stage = grid_.pp_rank();
  const int v = static_cast<int>(cfg_.parallel.virtual_stages);
  const StageLayers layers =
      stage_layer_range(cfg_.model, pp, stage, v, cfg_.parallel.stage_layers);
  stage_layers_ = layers.per_stage;
  opts.first_layer = layers.first_layer;
  opts.num_layers = layers.num_layers;
  opts.chunks = layers.chunks;
  opts.chunk_stride = layers.chunk_stride;
  opts.recompute = cfg_.parallel.recompute == "full"        ? Recompute::full
                   : cfg_.parallel.recompute == "selective" ? Recompute::selective
                                                            : Recompute::none;
  opts.sequence_parallel = cfg_.parallel.sequence_parallel;
  opts.has_embedding = grid_.first_stage();
  opts.has_head = grid_.last_stage();
  // Activation sets: the most microbatches this stage holds at once in 1F1B, over the
  // largest number of microbatches a step can have (the batch ramp only shrinks it).
  const int max_micro = static_cast<int>(cfg_.train.global_batch / (mb * dp));
  opts.slots = pp > 1 ? max_in_flight(pipeline_schedule(pp, stage, max_micro, v)) : 1;
  opts.losses_per_read = max_micro;  // read once per step
  if (pp > 1) pipeline_.reset(static_cast<int>(opts.slots), max_micro, v);
  opts.compute_dtype = compute_dtype_of(cfg_.train.precision);
  opts.flat_multiple = dp;
  model_ = std::make_unique<GptModel>(cfg_.model, opts, backend_, grid_.tp());
  model_->initialize(cfg_.train.seed);
  if (dp > 1) {
    grad_sync_ = std::make_unique<GradSync>(model_->params(), backend_, grid_.dp(),
                                            cfg_.parallel.bucket_size, cfg_.parallel.zero1);
    optimizer_ = std::make_unique<AdamW>(model_->params(), backend_, cfg_.train,
                                         grad_sync_->ranges(), grad_sync_->state_elems());
  } else {
    optimizer_ = std::make_unique<AdamW>(model_->params(), backend_, cfg_.train);
  }
  groups_.grad_sync = grad_sync_.get();
  groups_.loss_group = &grid_.dp();
  groups_.norm_group = grad_sync_ && grad_sync_->zero1() ? &grid_.world() : &grid_.model_parallel();
  groups_.tp_rank = grid_.tp_rank();
  groups_.embedding = grid_.embedding();
  groups_.pp = pp > 1 ? &grid_.pp() : nullptr;
  groups_.pipeline = &pipeline_;
  groups_.tp = &grid_.tp();
  tokens_.resize(mb * seq_);
  targets_.resize(mb * seq_);

  const int64_t decay = cfg_.train.decay_tokens > 0 ? cfg_.train.decay_tokens
                                                    : total_run_tokens(cfg_, dp);
  lr_ = std::make_unique<LrSchedule>(cfg_.train, decay);
  ramp_ = std::make_unique<BatchRamp>(cfg_.train, mb * dp);
  if (world_->rank() == 0) metrics_ = std::make_unique<MetricsLog>(cfg_.log.metrics_file);
  if (world_->rank() == 0 && (!cfg_.log.emf_file.empty() || !cfg_.log.emf_address.empty())) {
    emf_ = std::make_unique<EmfLog>(cfg_.log, emf_run_name(cfg_),
                                    emf_layout(grid_.tp_size(), grid_.pp_size(), grid_.dp_size()));
  }
  const GpuSpec* gpu = cfg_.train.gpu.empty() ? nullptr : find_gpu(cfg_.train.gpu);
  if (!gpu && backend_.device() == Device::cuda && cfg_.log.peak_tflops <= 0) {
    gpu = gpu_from_device_name(backend_.name(), backend_.device_memory().total);
    if (!gpu) {
      throw UserError(fmt::format("{}: {} is not a GPU jumbo knows the peak of: set train.gpu "
                                  "(one of {}) or log.peak_tflops",
                                  cfg_.source, backend_.name(), known_gpu_names()));
    }
  }
  peak_tflops_ = cfg_.log.peak_tflops > 0 ? cfg_.log.peak_tflops
                 : gpu                    ? gpu->bf16_tflops
                                          : measure_fp32_peak_gflops(0.3) / 1000.0;

  const ParamStore& ps = model_->params();
  print(fmt::format("model {}: {} layers, d_model {}, {} heads, ffn {}, vocab {} (padded {}), "
                    "context {}; {:.2f}M parameters",
                    cfg_.model.name, cfg_.model.layers, cfg_.model.d_model, cfg_.model.heads,
                    cfg_.model.ffn_dim(), cfg_.model.vocab, model_->padded_vocab(),
                    cfg_.model.context, static_cast<double>(parameter_count(cfg_.model)) / 1e6));
  print(fmt::format("layout tp {} x pp {} x dp {} on {} ranks{}{}, recompute {}; {} {}; memory per rank: "
                    "params+grads {}, adam {}, activations {}; peak {:.3f} TFLOP/s ({})",
                    grid_.tp_size(), grid_.pp_size(), dp, world_->size(),
                    grad_sync_ && grad_sync_->zero1() ? ", ZeRO-1" : "",
                    cfg_.parallel.sequence_parallel && grid_.tp_size() > 1 ? ", sequence parallel" : "",
                    cfg_.parallel.recompute,
                    backend_.name(),
                    to_string(cfg_.train.precision),
                    human_bytes(static_cast<double>(ps.bytes()), 1),
                    human_bytes(static_cast<double>(optimizer_->state_bytes()), 1),
                    human_bytes(static_cast<double>(model_->activation_bytes()), 1), peak_tflops_,
                    cfg_.log.peak_tflops > 0 ? "log.peak_tflops"
                    : gpu                    ? "GPU bf16"
                                             : "measured fp32"));
  if (pp > 1) {
    std::string split;
    for (int64_t n : stage_layers_) split += fmt::format("{}{}", split.empty() ? "" : " ", n);
    print(fmt::format("pipeline: {} stages, layers per stage {} (embedding and head counted "
                      "as {:.2f} layers{}), {}, {} microbatches per step",
                      pp, split,
                      static_cast<double>(cfg_.model.padded_vocab()) / (12.0 * cfg_.model.d_model),
                      cfg_.parallel.stage_layers.empty() ? "" : "; given by parallel.stage_layers",
                      v > 1 ? fmt::format("interleaved 1F1B with {} chunks per rank", v) : "1F1B",
                      max_micro));
  }
  print(fmt::format("data: {} ({} tokens, {} samples of {}), tokenizer {}", cfg_.data.train,
                    train_data_->num_tokens(), train_sampler_->samples_per_epoch(), seq_ + 1,
                    cfg_.data.tokenizer));
  if (!cfg_.checkpoint.dir.empty() || cfg_.checkpoint.resume != "none") {
    checkpointer_ = std::make_unique<Checkpointer>(cfg_, *world_);
    resume_from_checkpoint();
  }
}

void Trainer::check_planned_memory() {
  const PlanLayout layout = plan_layout_of(cfg_, grid_.dp_size());
  planned_cpu_bytes_ =
      estimate_memory(cfg_.model, layout, plan_target_of(cfg_, PlanDevice::cpu)).total();
  const MemoryEstimate e =
      estimate_memory(cfg_.model, layout, plan_target_of(cfg_, PlanDevice::gpu));
  planned_gpu_bytes_ = e.total();
  if (cfg_.train.gpu.empty()) return;
  const GpuSpec& gpu = *find_gpu(cfg_.train.gpu);  // validate() checked the name
  const double budget = static_cast<double>(gpu.memory_bytes);
  const std::string why = explain_memory(e, budget, std::string(gpu.label));
  if (e.total() > budget) {
    throw UserError(fmt::format("{}: train.gpu = \"{}\": the layout {} does not fit: {}; "
                                "`jumbo plan --config {} --nodes N` lists layouts that do",
                                cfg_.source, cfg_.train.gpu, layout.describe(), why,
                                cfg_.source));
  }
  print(fmt::format("plan for train.gpu = {} ({} layout {}): fits, {}", cfg_.train.gpu,
                    gpu.instance, layout.describe(), why));
}

void Trainer::stop_for_signal(TrainSummary& summary, int signal, int64_t step, double lr,
                              int64_t batch) {
  summary.stop_signal = signal;
  if (checkpointer_ && !cfg_.checkpoint.dir.empty()) {
    if (!checkpointer_->due(step, cfg_.train.steps)) save_checkpoint(step, lr, batch);
    checkpointer_->wait();
    summary.stop_saved = true;
    print(fmt::format("stopping after step {} of {} on {}: checkpoint saved in {}; exit {} so "
                      "the job is requeued and resumes",
                      step, cfg_.train.steps, stop_signal_name(signal), cfg_.checkpoint.dir,
                      kExitStoppedForRequeue));
  } else {
    print(fmt::format("stopping after step {} of {} on {}: checkpoint.dir is empty, nothing "
                      "saved",
                      step, cfg_.train.steps, stop_signal_name(signal)));
  }
}

bool Trainer::writes_checkpoint() const {
  // Data-parallel replicas hold copies; with ZeRO-1 each holds its own optimizer slice.
  return grid_.dp_rank() == 0 || (grad_sync_ && grad_sync_->zero1());
}

std::vector<PieceData> Trainer::checkpoint_pieces(bool for_saving) {
  ParamStore& ps = model_->params();
  const std::array<Tensor, 3> state = saved_state();
  std::array<float*, 3> host{};
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].device == Device::cpu) {
      host[i] = state[i].as<float>();
      continue;
    }
    // Device state goes through host copies (kept between saves). A load writes only its
    // pieces' ranges, so the copy starts from the current state either way.
    staged_state_[i].resize(static_cast<size_t>(state[i].numel()));
    backend_.to_host(staged_state_[i].data(), state[i]);
    host[i] = staged_state_[i].data();
  }
  return optimizer_state_pieces(ps, grad_sync_ ? grad_sync_->ranges() : all_param_ranges(ps),
                                host[0], host[1], host[2], for_saving);
}

std::array<Tensor, 3> Trainer::saved_state() {
  return {model_->params().all_master(), optimizer_->exp_avg(), optimizer_->exp_avg_sq()};
}

void Trainer::upload_staged_state() {
  const std::array<Tensor, 3> state = saved_state();
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].device == Device::cpu) continue;
    backend_.from_host(state[i], staged_state_[i].data());
  }
  backend_.synchronize();
}

void Trainer::save_checkpoint(int64_t step, double lr, int64_t batch) {
  Manifest header;
  CheckpointProgress& p = header.progress;
  p.step = step;
  p.consumed_samples = consumed_samples_;
  p.consumed_tokens = consumed_tokens_;
  p.optimizer_steps = optimizer_->steps_taken();
  p.seed = cfg_.train.seed;
  p.lr = lr;
  p.global_batch = batch;
  header.model = cfg_.model;
  header.layout = {grid_.tp_size(), grid_.pp_size(), grid_.dp_size(),
                   grad_sync_ && grad_sync_->zero1(), cfg_.parallel.virtual_stages,
                   stage_layers_, to_string(cfg_.train.precision)};
  header.data_train = cfg_.data.train;
  header.tokenizer = cfg_.data.tokenizer;
  const bool writer = writes_checkpoint();
  checkpointer_->save(header, writer ? checkpoint_pieces(true) : std::vector<PieceData>{}, writer,
                      shard_file_name({grid_.tp_rank(), grid_.dp_rank(), grid_.pp_rank()}));
}

void Trainer::resume_from_checkpoint() {
  const bool reader = writes_checkpoint();
  const std::optional<Manifest> m = checkpointer_->resume(checkpoint_pieces(false), reader);
  if (!m) return;
  upload_staged_state();
  ParamStore& ps = model_->params();
  if (grad_sync_ && !grad_sync_->zero1()) {
    // dp rank 0 read the state; its replicas receive it over the data-parallel group.
    grid_.dp().broadcast(ps.all_master(), 0);
    grid_.dp().broadcast(optimizer_->exp_avg(), 0);
    grid_.dp().broadcast(optimizer_->exp_avg_sq(), 0);
  }
  ps.refresh_compute_copy(backend_);
  // ZeRO-1: each rank read only its shards; the weights of the others come from them.
  if (grad_sync_) grad_sync_->gather_weights();
  optimizer_->set_steps_taken(m->progress.optimizer_steps);
  step_ = m->progress.step;
  consumed_samples_ = m->progress.consumed_samples;
  consumed_tokens_ = m->progress.consumed_tokens;
  if (m->progress.seed != cfg_.train.seed) {
    print(fmt::format("checkpoint: saved with train.seed = {}, this run has {}: the data order "
                      "from here on follows the new seed", m->progress.seed, cfg_.train.seed));
  }
}

Trainer::~Trainer() = default;

void Trainer::print(const std::string& line) const {
  if (world_->rank() == 0) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
}

double Trainer::evaluate() {
  if (!valid_batches_) return NAN;
  valid_batches_->start_step(0);
  double sum = 0;
  Comm& pp = grid_.pp();
  const int stage = grid_.pp_rank();
  for (int64_t k = 0; k < cfg_.train.eval_batches / grid_.dp_size(); ++k) {
    valid_batches_->next(tokens_.data(), targets_.data());
    // Forward only, through every model chunk in virtual-stage order: activations flow one
    // way, so plain waits cannot deadlock.
    const int v = static_cast<int>(cfg_.parallel.virtual_stages);
    for (int chunk = 0; chunk < v; ++chunk) {
      const PipeOpComm c = pipeline_op_comm({PipeOp::forward, 0, chunk}, grid_.pp_size(), stage, v);
      if (c.recv_from_rank >= 0) {
        CommRequest r = pp.irecv(model_->input(0), c.recv_from_rank, 0);
        pp.wait(r);
      }
      model_->forward(0, chunk, tokens_.data(), targets_.data());
      sum += model_->take_loss_sum();
      if (c.send_to_rank >= 0) {
        CommRequest r = pp.isend(model_->output(0), c.send_to_rank, 0);
        pp.wait(r);
      }
    }
  }
  sum = grid_.dp().all_reduce_scalar(sum, ReduceOp::sum);
  sum = pp.all_reduce_scalar(sum, ReduceOp::sum);
  return sum / static_cast<double>(cfg_.train.eval_batches * cfg_.parallel.micro_batch * seq_);
}

void Trainer::collect_comm_bytes(StepMetrics& m) {
  m.comm_bytes = {{"tp", grid_.tp().bytes_sent()}, {"dp", grid_.dp().bytes_sent()},
                  {"pp", grid_.pp().bytes_sent()}};
  if (grid_.embedding()) m.comm_bytes.emplace_back("embedding", grid_.embedding()->bytes_sent());
}

TrainSummary Trainer::run() {
  using clock = std::chrono::steady_clock;
  struct DenormalScope {
    Backend& b;
    explicit DenormalScope(Backend& backend) : b(backend) { b.set_flush_denormals(true); }
    ~DenormalScope() { b.set_flush_denormals(false); }
  } denormals(backend_);
  TrainSummary summary;
  int64_t& consumed_samples = consumed_samples_;
  int64_t& consumed_tokens = consumed_tokens_;
  double time_spent = 0;
  const int64_t steps = cfg_.train.steps;
  summary.first_step = step_ + 1;
  summary.steps = step_;
  for (int64_t step = step_ + 1; step <= steps; ++step) {
    const auto t0 = clock::now();
    if (checkpointer_) checkpointer_->poll();
    const int64_t batch = ramp_->at(consumed_tokens);
    const int64_t batch_tokens = batch * seq_;
    const double lr = lr_->at(consumed_tokens + batch_tokens);
    train_batches_->start_step(consumed_samples);
    if (cfg_.log.comm) {
      for (Comm* c : {&grid_.tp(), &grid_.dp(), &grid_.pp(), grid_.embedding()}) {
        if (c) c->reset_bytes();
      }
    }
    const int64_t micro_steps = batch / (cfg_.parallel.micro_batch * grid_.dp_size());
    if (groups_.pp) {
      const int v = static_cast<int>(cfg_.parallel.virtual_stages);
      if (v > 1 && micro_steps % grid_.pp_size() != 0) {
        throw UserError(fmt::format("step {}: {} microbatches (batch ramp-up) is not a multiple "
                                    "of parallel.pp = {}, which interleaving needs",
                                    step, micro_steps, grid_.pp_size()));
      }
      if (schedule_micro_steps_ != micro_steps) {  // changes only during the batch ramp-up
        schedule_ = pipeline_schedule(grid_.pp_size(), grid_.pp_rank(),
                                      static_cast<int>(micro_steps), v);
        schedule_micro_steps_ = micro_steps;
      }
      groups_.schedule = &schedule_;
    }
    const StepResult r = train_step(*model_, *optimizer_, *train_batches_, micro_steps,
                                    batch_tokens, lr, cfg_.train.grad_clip, tokens_.data(),
                                    targets_.data(), groups_);
    if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
      throw UserError(fmt::format("step {}: loss is {} (grad norm {}); stopping before the "
                                  "update. Lower train.lr (now {}) or check the data",
                                  step, r.loss, r.grad_norm, cfg_.train.lr));
    }
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    consumed_samples += batch;
    consumed_tokens += batch_tokens;
    time_spent += dt;

    StepMetrics m;
    m.step = step;
    m.total_steps = steps;
    m.loss = r.loss;
    m.lr = lr;
    m.grad_norm = r.grad_norm;
    m.global_batch = batch;
    m.tokens = consumed_tokens;
    m.step_time_s = dt;
    m.tokens_per_s = static_cast<double>(batch_tokens) / dt;
    m.tflops_per_device = model_flops_per_iteration(cfg_.model, batch, seq_) / dt /
                          static_cast<double>(world_->size()) / 1e12;
    m.mfu = m.tflops_per_device / peak_tflops_;
    m.mem_peak_bytes = peak_rss_bytes();
    m.eta_s = time_spent / static_cast<double>(step - summary.first_step + 1) *
              static_cast<double>(steps - step);
    if (cfg_.train.eval_every > 0 && (step % cfg_.train.eval_every == 0 || step == steps)) {
      m.val_loss = evaluate();
      summary.final_val_loss = m.val_loss;
    }
    if (cfg_.log.comm) collect_comm_bytes(m);
    if (metrics_) metrics_->write(m);
    if (step % cfg_.log.every == 0 || step == steps || step == 1 || m.val_loss) {
      print(human_line(m));
      if (emf_) emf_->write(m);
    }
    summary.losses.push_back(r.loss);
    summary.final_loss = r.loss;
    summary.steps = step;
    step_ = step;
    if (checkpointer_ && checkpointer_->due(step, steps)) save_checkpoint(step, lr, batch);
    // Every rank stops after the same step: the first signal any of them got decides.
    const int signal = static_cast<int>(
        world_->all_reduce_scalar(static_cast<double>(stop_signal_received()), ReduceOp::max));
    if (signal != 0 && step < steps) {
      stop_for_signal(summary, signal, step, lr, batch);
      break;
    }
  }
  if (checkpointer_) checkpointer_->wait();
  // On a GPU: device memory in use (arenas are allocated once, so this is the peak) against
  // the plan's GPU model; on the CPU: the peak resident set against its CPU model.
  const bool on_gpu = backend_.device() == Device::cuda;
  summary.planned_bytes = on_gpu ? planned_gpu_bytes_ : planned_cpu_bytes_;
  const double measured = on_gpu ? static_cast<double>(backend_.device_memory().used)
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
