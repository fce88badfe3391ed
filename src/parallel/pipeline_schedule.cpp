// Pipeline schedules: the per-rank order of forwards and backwards (1F1B and Megatron's
// interleaved 1F1B) and the transfers each operation implies.
#include "jumbo/parallel/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace jumbo {
namespace {

void check_arguments(int stages, int stage, int microbatches, int virtual_stages) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("pipeline schedule: " + what);
  };
  if (stages < 1) fail("stages = " + std::to_string(stages) + ", expected >= 1");
  if (stage < 0 || stage >= stages)
    fail("stage = " + std::to_string(stage) + ", expected 0.." + std::to_string(stages - 1));
  if (microbatches < 1) fail("microbatches = " + std::to_string(microbatches) + ", expected >= 1");
  if (virtual_stages < 1)
    fail("virtual_stages = " + std::to_string(virtual_stages) + ", expected >= 1");
  if (virtual_stages > 1 && microbatches % stages != 0)
    fail("microbatches = " + std::to_string(microbatches) +
         " with interleaving, expected a multiple of the pipeline stages (" +
         std::to_string(stages) + ")");
}

// The k-th forward (or backward) of a rank, counting over all chunks. Interleaved order walks
// groups of p microbatches: chunk 0 for the group, chunk 1 for the same group, ..., then the
// next group; backwards run the chunks last to first (Megatron's get_model_chunk_id).
PipeOp nth_op(PipeOp::Kind kind, int k, int stages, int virtual_stages) {
  if (virtual_stages == 1) return {kind, k, 0};
  const int group_size = stages * virtual_stages;
  const int in_group = k % group_size;
  const int chunk = in_group / stages;
  const int microbatch = (k / group_size) * stages + in_group % stages;
  return {kind, microbatch, kind == PipeOp::forward ? chunk : virtual_stages - 1 - chunk};
}

}  // namespace

int virtual_stage(int stage, int chunk, int stages) { return chunk * stages + stage; }

int owner_of(int virtual_stage, int stages) { return virtual_stage % stages; }

int pipeline_warmup_forwards(int stages, int stage, int microbatches, int virtual_stages) {
  check_arguments(stages, stage, microbatches, virtual_stages);
  const int total = microbatches * virtual_stages;
  if (virtual_stages == 1) return std::min(stages - stage - 1, microbatches);
  // Later ranks start their first backward sooner; every rank first fills chunks 0..v-2
  // for one group (the (v - 1) p term), and rank r twice more per rank behind it.
  return std::min(2 * (stages - stage - 1) + (virtual_stages - 1) * stages, total);
}

std::vector<PipeOp> pipeline_schedule(int stages, int stage, int microbatches,
                                      int virtual_stages, PipelineMode mode) {
  const int warmup = pipeline_warmup_forwards(stages, stage, microbatches, virtual_stages);
  const int total = microbatches * virtual_stages;
  std::vector<PipeOp> ops;
  if (mode == PipelineMode::forward_only) {
    ops.reserve(static_cast<size_t>(total));
    for (int k = 0; k < total; ++k) ops.push_back(nth_op(PipeOp::forward, k, stages, virtual_stages));
    return ops;
  }
  ops.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) ops.push_back(nth_op(PipeOp::forward, k, stages, virtual_stages));
  for (int k = 0; k < total - warmup; ++k) {  // steady state: one forward, one backward
    ops.push_back(nth_op(PipeOp::forward, warmup + k, stages, virtual_stages));
    ops.push_back(nth_op(PipeOp::backward, k, stages, virtual_stages));
  }
  for (int k = total - warmup; k < total; ++k)  // cool-down: drain the backwards
    ops.push_back(nth_op(PipeOp::backward, k, stages, virtual_stages));
  return ops;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  int held = 0, most = 0;
  for (const PipeOp& op : ops) {
    held += op.kind == PipeOp::forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

PipeOpComm pipeline_op_comm(const PipeOp& op, int stages, int stage, int virtual_stages) {
  const int s = virtual_stage(stage, op.chunk, stages);
  const int last = stages * virtual_stages - 1;
  PipeOpComm comm{.virtual_stage = s};
  comm.reads_tokens = op.kind == PipeOp::forward && s == 0;
  comm.computes_loss = s == last;
  const int before = s > 0 ? owner_of(s - 1, stages) : -1;
  const int after = s < last ? owner_of(s + 1, stages) : -1;
  if (op.kind == PipeOp::forward) {
    comm.recv_from_rank = before;
    comm.send_to_rank = after;
  } else {
    comm.recv_from_rank = after;
    comm.send_to_rank = before;
  }
  return comm;
}

double pipeline_bubble_fraction(int stages, int microbatches, int virtual_stages) {
  check_arguments(stages, 0, microbatches, virtual_stages);
  const double idle = stages - 1;
  return idle / (static_cast<double>(virtual_stages) * microbatches + idle);
}

}  // namespace jumbo
