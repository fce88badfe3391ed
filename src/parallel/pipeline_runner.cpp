#include "jumbo/parallel/pipeline_runner.h"

#include <algorithm>

#include "jumbo/comm/watchdog.h"

namespace jumbo {

PipelineRunner::PipelineRunner(GptModel& model, Comm& pp, const StagePlan& plan)
    : model_(model),
      pp_(pp),
      stages_(pp.size()),
      stage_(pp.rank()),
      chunks_(static_cast<int>(plan.model.chunks)) {
  train_.microbatches = plan.microbatches;
  train_.ops = plan.schedule;
  tokens_per_microbatch_ = static_cast<size_t>(plan.model.micro_batch * plan.model.seq);
  tokens_.resize(tokens_per_microbatch_);
  targets_.resize(tokens_per_microbatch_);
  const int slots = static_cast<int>(plan.model.slots);
  slot_of_.assign(
      static_cast<size_t>(std::max(plan.microbatches, plan.eval_microbatches) * chunks_), -1);
  free_slots_.reserve(slots);
  fwd_sent_.assign(slots, CommRequest{});
  bwd_sent_.assign(slots, CommRequest{});
}

const std::vector<PipeOp>& PipelineRunner::schedule(PipelineMode mode, int64_t microbatches) {
  Schedule& s = mode == PipelineMode::train ? train_ : forward_only_;
  if (s.microbatches != microbatches) {
    s.ops = pipeline_schedule(stages_, stage_, static_cast<int>(microbatches), chunks_, mode);
    s.microbatches = microbatches;
  }
  return s.ops;
}

// Each op's send is posted in one group with the next op's receive (Megatron's
// send_forward_recv_backward and the like): NCCL runs a group as one operation, so two stages
// sending to each other cannot deadlock; for MPI the group is nothing. Receives are waited
// before their op; sends only before their buffer is reused, which keeps every wait behind
// its matching receive in the schedule's dependency order.
double PipelineRunner::run(MicrobatchSource& source, const PipelineRun& run) {
  const std::vector<PipeOp>& ops = schedule(run.mode, run.microbatches);
  const bool train = run.mode == PipelineMode::train;
  model_.begin_run(train ? run.dropout_seed : std::nullopt);
  // Packed examples: every stage's attention needs the positions, so every rank reads each
  // microbatch once, at its first chunk's forward, and keeps it for the later chunks (grown
  // once, for the largest microbatch count).
  const bool examples = source.holds_examples();
  const size_t n = tokens_per_microbatch_;
  if (examples && positions_.size() < static_cast<size_t>(run.microbatches) * n) {
    for (auto* b : {&tokens_, &targets_, &positions_}) b->resize(static_cast<size_t>(run.microbatches) * n);
  }
  auto microbatch = [&](const PipeOp& op) {
    const size_t at = examples ? static_cast<size_t>(op.microbatch) * n : 0;
    return MicrobatchView{tokens_.data() + at, targets_.data() + at,
                          examples ? positions_.data() + at : nullptr};
  };
  const int v = chunks_, virtual_total = stages_ * chunks_;
  if (slot_of_.size() < static_cast<size_t>(run.microbatches * v)) {
    slot_of_.resize(static_cast<size_t>(run.microbatches * v));  // more than planned: rare
  }
  free_slots_.clear();
  for (int s = static_cast<int>(fwd_sent_.size()) - 1; s >= 0; --s) free_slots_.push_back(s);
  // Every (microbatch, chunk) has one backward in a training schedule, none otherwise.
  int64_t backwards_left = train ? run.microbatches * v : 0;
  // Tag of the message leaving virtual stage `from` for microbatch k in direction dir.
  auto tag = [&](int k, int from, int dir) { return 2 * (k * virtual_total + from) + dir; };
  // Op k's activation slot (a forward takes a free one) and its receive, if any.
  auto post_receive = [&](size_t k) -> CommRequest {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages_, stage_, v);
    int& slot = slot_of_[op.microbatch * v + op.chunk];
    if (op.kind == PipeOp::forward) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    if (c.recv_from_rank < 0) return {};
    if (op.kind == PipeOp::forward) {
      return pp_.irecv(model_.input(slot), c.recv_from_rank,
                       tag(op.microbatch, c.virtual_stage - 1, 0));
    }
    return pp_.irecv(model_.grad_output(), c.recv_from_rank,
                     tag(op.microbatch, c.virtual_stage + 1, 1));
  };
  model_.set_weights_needed_hook(run.weights_needed);
  CommRequest received;
  if (!ops.empty()) {
    pp_.group_start();
    received = post_receive(0);
    pp_.group_end();
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages_, stage_, v);
    const int slot = slot_of_[op.microbatch * v + op.chunk];
    pp_.wait(received);
    if (op.kind == PipeOp::forward) {
      // Forward only: the slot's previous output may still be on its way to the next stage.
      pp_.wait(fwd_sent_[slot]);
      const MicrobatchView mb = microbatch(op);
      if (examples ? op.chunk == 0 : c.reads_tokens || c.computes_loss) source.next(mb);
      model_.forward(slot, op.chunk, mb.tokens, mb.targets, mb.positions);
    } else {
      if (--backwards_left == 0) model_.set_grads_ready_hook(run.grads_ready);
      pp_.wait(bwd_sent_[slot]);  // the slot's d(input) buffer is about to be rewritten
      model_.backward(slot, op.chunk, run.loss_scale);
      pp_.wait(fwd_sent_[slot]);
    }
    pp_.group_start();
    if (c.send_to_rank >= 0) {
      if (op.kind == PipeOp::forward) {
        fwd_sent_[slot] = pp_.isend(model_.output(slot), c.send_to_rank,
                                    tag(op.microbatch, c.virtual_stage, 0));
      } else {
        bwd_sent_[slot] = pp_.isend(model_.grad_input(slot), c.send_to_rank,
                                    tag(op.microbatch, c.virtual_stage, 1));
      }
    }
    // A slot is free again after its backward, or (forward only) once its forward ran.
    if (op.kind == PipeOp::backward || !train) free_slots_.push_back(slot);
    received = k + 1 < ops.size() ? post_receive(k + 1) : CommRequest{};
    pp_.group_end();
  }
  for (CommRequest& r : bwd_sent_) pp_.wait(r);
  for (CommRequest& r : fwd_sent_) pp_.wait(r);
  if (train) model_.set_grads_ready_hook(nullptr);
  model_.set_weights_needed_hook(nullptr);
  // The run's one read of the losses. On a GPU the host waits here for the run's kernels and
  // collectives: watched like a blocking collective, so a peer that hangs ends the job.
  const BlockingOp watch("waiting for the GPU's step (losses)", "device");
  if (!run.token_losses) return model_.take_loss_sum();
  const size_t first = run.token_losses->size();
  model_.take_token_losses(*run.token_losses);
  double sum = 0;
  for (size_t i = first; i < run.token_losses->size(); ++i) sum += (*run.token_losses)[i];
  return sum;
}

}  // namespace jumbo
