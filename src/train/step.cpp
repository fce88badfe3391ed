#include "jumbo/train/step.h"

#include "jumbo/comm/watchdog.h"

#include <cmath>
#include <functional>
#include <stdexcept>
#include <vector>

namespace jumbo {
namespace {

// Sequence parallelism leaves the norms' and position embedding's gradients as partial sums
// over the tp ranks. They are all-reduced over tp once complete — from the backward hook of
// the last microbatch, just before the data-parallel bucket holding them is launched.
class SequencePartialGrads {
 public:
  SequencePartialGrads(GptModel& model, Comm* tp)
      : model_(model), tp_(tp), params_(model.sequence_partial_params()) {}
  void reduce_from(int64_t flat) {
    while (tp_ && next_ < params_.size() &&
           model_.params().info(params_[next_]).flat_offset >= flat) {
      tp_->all_reduce(model_.params().grad(params_[next_++]), ReduceOp::sum);
    }
  }

 private:
  GptModel& model_;
  Comm* tp_;
  const std::vector<int>& params_;
  size_t next_ = 0;
};

// The hook for the last microbatch's backward: complete partial sums, then launch buckets.
std::function<void(int64_t)> grads_ready(SequencePartialGrads& partial, GradSync* sync) {
  return [&partial, sync](int64_t flat) {
    partial.reduce_from(flat);
    if (sync) sync->grads_ready_from(flat);
  };
}

// The step's one read of the losses (last stage). On a GPU the host waits here for the
// step's kernels and collectives: watched like a blocking collective, so a peer that hangs
// ends the job instead of this wait.
// The watchdog's name for a host wait on the GPU (BlockingOp keeps a pointer to it).
const std::string kDeviceGroup = "device";

double read_loss_sum(GptModel& model) {
  const BlockingOp watch("waiting for the GPU's step (losses)", kDeviceGroup);
  return model.take_loss_sum();
}

// Gradient accumulation on one pipeline stage (or no pipeline): forward then backward.
double run_microbatches(GptModel& model, MicrobatchSource& source, int64_t micro_steps,
                        float loss_scale, int32_t* tokens, int32_t* targets,
                        const StepGroups& g, SequencePartialGrads& partial) {
  for (int64_t k = 0; k < micro_steps; ++k) {
    source.next(tokens, targets);
    model.forward(0, tokens, targets);
    if (k == micro_steps - 1) model.set_grads_ready_hook(grads_ready(partial, g.grad_sync));
    model.backward(0, loss_scale);
  }
  return read_loss_sum(model);
}

// One stage of a pipeline: the schedule's ops in order (1F1B or interleaved), activations and
// their gradients over non-blocking point-to-point. Each op's send is posted in one group with
// the next op's receive (Megatron's send_forward_recv_backward and the like): NCCL runs a group
// as one operation, so two stages sending to each other cannot deadlock; for MPI the group is
// nothing. Receives are waited before their op; sends only before their buffer is reused,
// which keeps every wait behind its matching receive in the schedule's dependency order.
double run_pipeline(GptModel& model, MicrobatchSource& source, float loss_scale, int32_t* tokens,
                    int32_t* targets, const StepGroups& g, SequencePartialGrads& partial) {
  Comm& pp = *g.pp;
  PipelineState& st = *g.pipeline;
  const int stage = pp.rank(), stages = pp.size(), v = st.chunks;
  const int virtual_total = stages * v;
  const std::vector<PipeOp>& ops = *g.schedule;
  int backwards_left = 0;
  for (const PipeOp& op : ops) backwards_left += op.kind == PipeOp::backward;
  // Tag of the message leaving virtual stage `from` for microbatch k in direction dir.
  auto tag = [&](int k, int from, int dir) { return 2 * (k * virtual_total + from) + dir; };
  // Op k's activation slot (a forward takes a free one) and its receive, if any.
  auto post_receive = [&](size_t k) -> CommRequest {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages, stage, v);
    int& slot = st.slot_of[op.microbatch * v + op.chunk];
    if (op.kind == PipeOp::forward) {
      slot = st.free_slots.back();
      st.free_slots.pop_back();
    }
    if (c.recv_from_rank < 0) return {};
    if (op.kind == PipeOp::forward)
      return pp.irecv(model.input(slot), c.recv_from_rank, tag(op.microbatch, c.virtual_stage - 1, 0));
    return pp.irecv(model.grad_output(), c.recv_from_rank, tag(op.microbatch, c.virtual_stage + 1, 1));
  };
  CommRequest received;
  if (!ops.empty()) {
    pp.group_start();
    received = post_receive(0);
    pp.group_end();
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    const PipeOp& op = ops[k];
    const PipeOpComm c = pipeline_op_comm(op, stages, stage, v);
    const int slot = st.slot_of[op.microbatch * v + op.chunk];
    pp.wait(received);
    if (op.kind == PipeOp::forward) {
      if (c.reads_tokens || c.computes_loss) source.next(tokens, targets);
      model.forward(slot, op.chunk, tokens, targets);
    } else {
      if (--backwards_left == 0) model.set_grads_ready_hook(grads_ready(partial, g.grad_sync));
      pp.wait(st.bwd_sent[slot]);  // the slot's d(input) buffer is about to be rewritten
      model.backward(slot, op.chunk, loss_scale);
      pp.wait(st.fwd_sent[slot]);
    }
    pp.group_start();
    if (c.send_to_rank >= 0) {
      if (op.kind == PipeOp::forward) {
        st.fwd_sent[slot] = pp.isend(model.output(slot), c.send_to_rank,
                                     tag(op.microbatch, c.virtual_stage, 0));
      } else {
        st.bwd_sent[slot] = pp.isend(model.grad_input(slot), c.send_to_rank,
                                     tag(op.microbatch, c.virtual_stage, 1));
      }
    }
    if (op.kind == PipeOp::backward) st.free_slots.push_back(slot);
    received = k + 1 < ops.size() ? post_receive(k + 1) : CommRequest{};
    pp.group_end();
  }
  for (CommRequest& r : st.bwd_sent) pp.wait(r);
  for (CommRequest& r : st.fwd_sent) pp.wait(r);
  return read_loss_sum(model);
}

}  // namespace

void PipelineState::reset(int slots, int max_microbatches, int virtual_stages) {
  chunks = virtual_stages;
  slot_of.assign(static_cast<size_t>(max_microbatches) * virtual_stages, -1);
  free_slots.clear();
  free_slots.reserve(slots);
  for (int s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  fwd_sent.assign(slots, CommRequest{});
  bwd_sent.assign(slots, CommRequest{});
}

StepResult train_step(GptModel& model, AdamW& opt, MicrobatchSource& source, int64_t micro_steps,
                      int64_t batch_tokens, double lr, double grad_clip, int32_t* tokens,
                      int32_t* targets, const StepGroups& g) {
  StepResult r;
  model.zero_grads();
  if (g.grad_sync) g.grad_sync->start_step();
  const float loss_scale = 1.0f / static_cast<float>(batch_tokens);
  SequencePartialGrads partial(model, g.tp);
  double loss_sum = g.pp && g.pp->size() > 1
                        ? run_pipeline(model, source, loss_scale, tokens, targets, g, partial)
                        : run_microbatches(model, source, micro_steps, loss_scale, tokens,
                                           targets, g, partial);
  model.set_grads_ready_hook(nullptr);
  partial.reduce_from(0);  // whatever the hook has not reached
  // The two copies of the tied embedding (first and last stage) get the sum of both
  // gradients, before the data-parallel reduction of the bucket that holds them.
  if (g.embedding && g.embedding->size() > 1) {
    g.embedding->all_reduce(model.embedding_grad(), ReduceOp::sum);
  }
  if (g.grad_sync) g.grad_sync->finish();
  if (g.loss_group) loss_sum = g.loss_group->all_reduce_scalar(loss_sum, ReduceOp::sum);
  if (g.pp) loss_sum = g.pp->all_reduce_scalar(loss_sum, ReduceOp::sum);  // only the last stage has it
  r.loss = loss_sum / static_cast<double>(batch_tokens);

  Tensor grads = g.grad_sync ? g.grad_sync->optimizer_grads() : model.params().all_grads();
  double sq = 0;
  {
    const BlockingOp watch("waiting for the GPU's step (grad norm)", kDeviceGroup);
    sq = grad_norm_squared(model.params(), opt.ranges(), grads, model.backend(), g.tp_rank);
  }
  if (g.norm_group) sq = g.norm_group->all_reduce_scalar(sq, ReduceOp::sum);
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  if (grad_clip > 0 && r.grad_norm > grad_clip) r.clip_scale = grad_clip / r.grad_norm;
  opt.step(lr, static_cast<float>(r.clip_scale), grads);
  if (g.grad_sync) g.grad_sync->gather_weights();
  return r;
}

}  // namespace jumbo
