#include "jumbo/parallel/pipeline_runner.h"

#include <algorithm>

#include "jumbo/comm/watchdog.h"
#include "jumbo/parallel/pipeline_exchange.h"

namespace jumbo {

PipelineRunner::PipelineRunner(ModelStage& model, Comm& pp, const StagePlan& plan)
    : model_(model),
      pp_(pp),
      stages_(pp.size()),
      stage_(pp.rank()),
      chunks_(static_cast<int>(plan.model.chunks)) {
  train_.microbatches = plan.microbatches;
  train_.ops = plan.schedule;
  train_.exchanges = pipeline_exchanges(train_.ops, stages_, stage_, chunks_);
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

const PipelineRunner::Schedule& PipelineRunner::schedule(PipelineMode mode, int64_t microbatches) {
  Schedule& s = mode == PipelineMode::train ? train_ : forward_only_;
  if (s.microbatches != microbatches) {
    s.ops = pipeline_schedule(stages_, stage_, static_cast<int>(microbatches), chunks_, mode);
    s.exchanges = pipeline_exchanges(s.ops, stages_, stage_, chunks_);
    s.microbatches = microbatches;
  }
  return s;
}

// The transfers go in the plan's exchanges (pipeline_exchange.h): each one point-to-point
// group with a block's sends and the next block's receives, a pairing that NCCL's rules (a
// group completes as a whole, one group after another) cannot deadlock; MPI needs none of it.
// Receives are waited before their op; sends only before their buffer is reused, which keeps
// every wait behind its matching receive in the schedule's dependency order.
double PipelineRunner::run(MicrobatchSource& source, const PipelineRun& run) {
  const Schedule& plan = schedule(run.mode, run.microbatches);
  const std::vector<PipeOp>& ops = plan.ops;
  const bool train = run.mode == PipelineMode::train;
  model_.begin_run(train ? run.dropout_seed : std::nullopt);
  // Packed examples: every stage's attention needs the positions, so every rank reads each
  // microbatch once, at its first chunk's forward, and keeps it for the later chunks (grown
  // once, for the largest microbatch count).
  const bool examples = source.holds_examples();
  const size_t n = tokens_per_microbatch_;
  if (examples && positions_.size() < static_cast<size_t>(run.microbatches) * n) {
    for (auto* b : {&tokens_, &targets_, &positions_}) {
      b->resize(static_cast<size_t>(run.microbatches) * n);
    }
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
  if (received_.size() < ops.size()) received_.resize(ops.size());  // grown once
  free_slots_.clear();
  for (int s = static_cast<int>(fwd_sent_.size()) - 1; s >= 0; --s) free_slots_.push_back(s);
  // Every (microbatch, chunk) has one backward in a training schedule, none otherwise.
  int64_t backwards_left = train ? run.microbatches * v : 0;
  // Tag of the message leaving virtual stage `from` for microbatch k in direction dir.
  auto tag = [&](int k, int from, int dir) { return 2 * (k * virtual_total + from) + dir; };
  auto slot_of = [&](const PipeOp& op) -> int& { return slot_of_[op.microbatch * v + op.chunk]; };
  // A forward takes a free activation slot at its receive, or when it runs if it has none.
  std::fill(slot_of_.begin(), slot_of_.end(), -1);
  auto take_slot = [&](const PipeOp& op) {
    int& slot = slot_of(op);
    if (slot < 0) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    return slot;
  };
  // Op k's receive into its forward's activation slot, or of its output gradient.
  auto post_receive = [&](int k) {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages_, stage_, v);
    if (op.kind == PipeOp::forward) {
      received_[k] = pp_.irecv(model_.input(take_slot(op)), c.recv_from_rank,
                               tag(op.microbatch, c.virtual_stage - 1, 0));
    } else {
      received_[k] = pp_.irecv(model_.grad_output(), c.recv_from_rank,
                               tag(op.microbatch, c.virtual_stage + 1, 1));
    }
  };
  auto post_send = [&](int k) {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages_, stage_, v);
    const int slot = slot_of(op);
    if (op.kind == PipeOp::forward) {
      fwd_sent_[slot] = pp_.isend(model_.output(slot), c.send_to_rank,
                                  tag(op.microbatch, c.virtual_stage, 0));
    } else {
      bwd_sent_[slot] = pp_.isend(model_.grad_input(slot), c.send_to_rank,
                                  tag(op.microbatch, c.virtual_stage, 1));
    }
  };
  auto exchange = [&](const PipeExchange& x) {
    pp_.group_start();
    for (int i = 0; i < x.count; ++i) {
      const PipePost& post = x.posts[i];
      if (post.kind == PipePost::send) {
        post_send(post.op);
      } else {
        post_receive(post.op);
      }
    }
    pp_.group_end();
  };
  model_.set_weights_needed_hook(run.weights_needed);
  size_t next = 0;  // the plan's next exchange
  auto exchange_after = [&](int k) {  // the exchange after op k (-1: before the first), if any
    if (next < plan.exchanges.size() && plan.exchanges[next].after_op == k) {
      exchange(plan.exchanges[next++]);
    }
  };
  exchange_after(-1);
  for (int k = 0; k < static_cast<int>(ops.size()); ++k) {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages_, stage_, v);
    const int slot = op.kind == PipeOp::forward ? take_slot(op) : slot_of(op);
    pp_.wait(received_[k]);
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
    // A slot is free again after its backward, or (forward only) once its forward ran.
    if (op.kind == PipeOp::backward || !train) free_slots_.push_back(slot);
    exchange_after(k);
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
