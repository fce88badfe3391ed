// The trainer's checkpoints: what this rank saves and loads (its optimizer state as pieces),
// the saves of the run, the resume at its start, and the save of a graceful stop.
#include <fmt/format.h>

#include "jumbo/ckpt/resolve.h"
#include "jumbo/comm/agreed_error.h"
#include "jumbo/plan/storage.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/runtime/stop_signal.h"
#include "jumbo/train/trainer.h"

namespace jumbo {

bool Trainer::writes_checkpoint() const {
  // Data-parallel replicas hold copies; with ZeRO-1 each holds its own optimizer slice.
  return stage_->grid().dp_rank() == 0 || stage_->plan().zero1;
}

std::array<Tensor, 3> Trainer::saved_state() {
  const AdamW& o = stage_->optimizer();
  return {o.master(), o.exp_avg(), o.exp_avg_sq()};
}

std::vector<PieceData> Trainer::checkpoint_pieces(StateUse use) {
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
  return optimizer_state_pieces(stage_->model().trained_params(), stage_->plan().optimizer_ranges,
                                {host[0], stage_->optimizer().master_index()}, host[1], host[2], use);
}

void Trainer::upload_staged_state() {
  const std::array<Tensor, 3> state = saved_state();
  for (size_t i = 0; i < state.size(); ++i) {
    if (state[i].device == Device::cpu) continue;
    backend_.from_host(state[i], staged_state_[i].data());
  }
  backend_.stream().synchronize();
}

bool Trainer::save_checkpoint(double lr, int64_t batch) {
  const int64_t step = progress_.step;
  // Room for it first: a save that cannot fit would only fail half-way (ENOSPC) after
  // writing most of a checkpoint. Every rank gets rank 0's verdict.
  if (const Checkpointer::Room room = checkpointer_->check_room(); !room.enough) {
    const int64_t kept = checkpointer_->last_complete_step();
    print(fmt::format("{}; stopping after step {} of {} without saving it: {}; exit {} so the "
                      "job is requeued (it starts again once the directory has room)",
                      room.line, step, cfg_.train.steps,
                      kept >= 0 ? fmt::format("the newest complete checkpoint, step {}, is kept",
                                              kept)
                                : std::string("no checkpoint of this run was saved"),
                      kExitStoppedForRequeue));
    return false;
  }
  Manifest header;
  CheckpointProgress& p = header.progress;
  progress_.save_into(p);
  p.optimizer_steps = stage_->optimizer().steps_taken();
  p.seed = cfg_.train.seed;
  p.lr = lr;
  p.global_batch = batch;
  header.model = cfg_.model;
  header.layout = cfg_.parallel;
  header.layout.stage_layers = stage_->plan().layers.per_stage;
  header.precision = cfg_.train.precision;
  header.data_train = cfg_.data.train;
  header.tokenizer = cfg_.data.tokenizer;
  header.chat_template = data_->chat_template_text();
  header.init_from = init_from_;
  header.lora = cfg_.finetune.lora(cfg_.model);
  p.anomalies = anomalies_.progress();
  const bool writer = writes_checkpoint();
  checkpointer_->save(header, writer ? checkpoint_pieces(StateUse::save) : std::vector<PieceData>{},
                      writer, shard_file_name(stage_->grid().coords()));
  return true;
}

void Trainer::check_checkpoint_room_at_start() {
  if (cfg_.checkpoint.dir.empty() || is_s3_url(cfg_.checkpoint.dir)) return;  // S3: no limit
  // Only rank 0 measures and compares; the size walks every writer's stage plan.
  if (world_->rank() == 0) {
    checkpointer_->set_expected_bytes(
        checkpoint_size(cfg_.model, cfg_.parallel, cfg_.finetune.lora(cfg_.model)).total());
  }
  const Checkpointer::Room room = checkpointer_->check_room();
  if (!room.enough) {
    // Rank 0's verdict, broadcast: every rank stops here, rank 0 says why.
    throw AgreedError(fmt::format("{}; not starting (free space there or give a larger "
                                  "checkpoint.dir; checkpoints already there are untouched)",
                                  room.line),
                      world_->rank() != 0);
  }
  if (!room.line.empty()) print(room.line);
}

void Trainer::load_frozen_base(const std::string& path, const std::string& where,
                               const std::string& fingerprint) {
  const ResolvedCheckpoint ckpt = open_checkpoint(path, s3_options(cfg_.checkpoint), *world_);
  // The manifest is rank 0's, broadcast: these verdicts are the same on every rank.
  try {
    check_manifest_model(ckpt.manifest, cfg_.model, where, cfg_.source);
  } catch (const UserError& e) {
    throw AgreedError(e.what(), world_->rank() != 0);
  }
  if (ckpt.manifest.lora.rank > 0) {
    throw AgreedError(fmt::format("{}: a LoRA checkpoint (adapters only); a base is a full "
                                  "checkpoint (jumbo ckpt merge makes one)", where),
                      world_->rank() != 0);
  }
  const std::string found = weights_fingerprint(ckpt.manifest);
  if (!fingerprint.empty() && found != fingerprint) {
    throw AgreedError(fmt::format("{}: fingerprint {}, but this fine-tune started from {}: the "
                                  "base checkpoint changed", where, found, fingerprint),
                      world_->rank() != 0);
  }
  std::string error;  // a shard one rank cannot read fails every rank alike
  try {
    load_weights(ckpt, stage_->model().params(), backend_, stage_->groups().dp);
  } catch (const UserError& e) {
    error = e.what();
  }
  if (const std::optional<std::string> failed = first_error(*world_, error)) {
    throw AgreedError(error.empty() ? *failed : error);  // each rank says why
  }
  init_from_ = {ckpt.storage->url(ckpt.dir), ckpt.manifest.progress.step, found};
}

void Trainer::init_from_checkpoint() {
  const std::string where = "train.init_from = " + cfg_.train.init_from;
  if (stage_->model().lora()) {  // the base frozen; the adapters start as initialised
    load_frozen_base(cfg_.train.init_from, where, "");
    print(fmt::format("init_from: the frozen base {} (step {}, fingerprint {}); LoRA rank {} on "
                      "{}, {} adapter parameters on this rank", init_from_.from, init_from_.step,
                      init_from_.fingerprint, cfg_.finetune.lora_rank,
                      describe(cfg_.finetune.lora(cfg_.model).targets),
                      stage_->model().trained_params().total_numel()));
    return;
  }
  ResolvedCheckpoint ckpt =
      open_checkpoint(cfg_.train.init_from, s3_options(cfg_.checkpoint), *world_);
  if (ckpt.manifest.lora.rank > 0) {  // the same on every rank: the manifest is broadcast
    throw AgreedError(fmt::format("{}: a LoRA checkpoint (adapters only); a full fine-tune "
                                  "starts from a full checkpoint (jumbo ckpt merge --adapter {} -o "
                                  "CKPT makes one), or set finetune.method = \"lora\" on its base",
                                  where, cfg_.train.init_from),
                      world_->rank() != 0);
  }
  std::string error;
  try {
    check_manifest_model(ckpt.manifest, cfg_.model, where, cfg_.source);
  } catch (const UserError& e) {
    error = e.what();
  }
  if (error.empty() && writes_checkpoint()) {
    // The master weights only: this rank's slice (with ZeRO-1 its shard), in any saved layout.
    std::vector<PieceData> pieces = checkpoint_pieces(StateUse::load);
    for (PieceData& p : pieces) p.state = {p.state[0], nullptr, nullptr};
    try {
      load_checkpoint_pieces(*ckpt.storage, ckpt.dir, ckpt.manifest, pieces);
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  if (const std::optional<std::string> failed = first_error(*world_, error)) {
    throw AgreedError(error.empty() ? *failed : error);  // each rank says why
  }
  distribute_loaded_state();
  init_from_ = {ckpt.storage->url(ckpt.dir), ckpt.manifest.progress.step,
                weights_fingerprint(ckpt.manifest)};
  print(fmt::format("init_from: the weights of {} (step {}, fingerprint {}); a fresh optimizer "
                    "from step 0", init_from_.from, init_from_.step, init_from_.fingerprint));
}

void Trainer::distribute_loaded_state() {
  upload_staged_state();
  AdamW& optimizer = stage_->optimizer();
  if (cfg_.parallel.dp > 1 && !stage_->plan().zero1) {
    // dp rank 0 read the state; its replicas receive it over the data-parallel group.
    Comm& dp = stage_->groups().dp;
    dp.broadcast(optimizer.master(), 0);
    dp.broadcast(optimizer.exp_avg(), 0);
    dp.broadcast(optimizer.exp_avg_sq(), 0);
  }
  optimizer.write_weights();
  // ZeRO-1: each rank read only its shards; the weights of the others come from them.
  stage_->grad_sync().start_weight_gather();
  stage_->grad_sync().wait_for_weights();
}

void Trainer::restore_loaded_state(const Manifest& m) {
  distribute_loaded_state();
  stage_->optimizer().set_steps_taken(m.progress.optimizer_steps);
  progress_ = RunProgress::saved_in(m.progress);
  init_from_ = m.init_from;
}

bool Trainer::resume_from_checkpoint() {
  const bool reader = writes_checkpoint();
  const std::optional<Manifest> m = checkpointer_->resume(checkpoint_pieces(StateUse::load), reader);
  if (!m) return false;
  restore_loaded_state(*m);
  if (stage_->model().lora()) {  // the adapters resumed; their base is the one they started on
    if (m->init_from.from.empty()) {  // the manifest is rank 0's, broadcast
      throw AgreedError(fmt::format("{}: a LoRA run resumed a checkpoint that records no base "
                                    "(init_from)", cfg_.checkpoint.dir),
                        world_->rank() != 0);
    }
    load_frozen_base(m->init_from.from, "the LoRA checkpoint's base " + m->init_from.from,
                     m->init_from.fingerprint);
  }
  anomalies_.restore(m->progress.anomalies);
  if (m->progress.seed != cfg_.train.seed) {
    print(fmt::format("checkpoint: saved with train.seed = {}, this run has {}: the data order "
                      "from here on follows the new seed", m->progress.seed, cfg_.train.seed));
  }
  if (!m->data_train.empty() && !(m->data_train == cfg_.data.train)) {
    print(fmt::format("checkpoint: trained on data.train = \"{}\", this run blends \"{}\": the "
                      "sample index continues at {} in the new mixture",
                      m->data_train.describe(), cfg_.data.train.describe(), progress_.consumed_samples));
  }
  return true;
}

bool Trainer::stop_on_signal(TrainSummary& summary, double lr, int64_t batch) {
  // Every rank stops after the same step: the first signal any of them got decides.
  const int signal = static_cast<int>(
      world_->all_reduce_scalar(static_cast<double>(stop_signal_received()), ReduceOp::max));
  const int64_t step = progress_.step;
  if (signal == 0 || step >= cfg_.train.steps) return false;
  summary.stop_signal = signal;
  if (checkpointer_ && !cfg_.checkpoint.dir.empty()) {
    if (!checkpointer_->due(step, cfg_.train.steps) && !save_checkpoint(lr, batch)) {
      summary.stop_no_room = true;  // the line is printed; the newest checkpoint is kept
      return true;
    }
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
  return true;
}

}  // namespace jumbo
