#pragma once
// How a pipeline rank moves its stage boundary tensors: the schedule's transfers grouped into
// exchanges, each one point-to-point group (posted together; under NCCL, and under
// comm.emulate = nccl, completed together, one group after another), and a check of a whole
// pipeline's exchanges under those rules. Pure functions: PipelineRunner posts the plan,
// tests run the check over every layout, docs/pipeline.md explains why this pairing.
//
// The pairing (Megatron's send_forward_backward_recv_forward_backward): a rank's ops fall into
// blocks, a steady-state forward with the backward after it, every other op alone; one
// exchange precedes the first block with its receives, and one follows each block with the
// block's sends and the next block's receives. Each exchange of one rank thus meets its
// neighbours' exchanges of the same step. Pairing each op's send with the next op's receive
// instead deadlocks the interleaved schedule under NCCL (pp 2, v 2, 4 microbatches: each rank
// stops in a group whose receive is matched by a later group of the other, behind its own
// blocked send). Only the steady state pairs: with no steady state (every forward a warm-up
// one) pairing the last forward with the first backward deadlocks too (p 8, v 3, m 8).
#include <array>
#include <string>
#include <vector>

#include "jumbo/parallel/pipeline_schedule.h"

namespace jumbo {

// One transfer of an exchange: the send of op `op`'s result (a forward's output, a backward's
// input gradient) or the receive of its input (a forward's input, a backward's output
// gradient). `op` indexes the rank's schedule.
struct PipePost {
  enum Kind { send, recv } kind;
  int op;
};

struct PipeExchange {
  int after_op = -1;  // the op it follows; -1: before the first op
  int count = 0;
  std::array<PipePost, 4> posts{};  // sends first, then receives; each in op order
};

// The exchanges of rank `stage`'s `ops` (its pipeline_schedule), in order; exchanges with
// nothing to move are left out. Ops without a peer (the first virtual stage's forward
// receive, the last's send) post nothing.
std::vector<PipeExchange> pipeline_exchanges(const std::vector<PipeOp>& ops, int stages,
                                             int stage, int virtual_stages);

// Runs every rank's exchanges (exchanges[r] for ops[r]) under NCCL's rules: tags ignored (the
// transfers from one rank to another match in posting order), each rank's groups one after
// another, a group complete once each transfer's peer group has been posted. Returns "" when
// every group completes and every receive gets the tensor it expects, else one line: the
// ranks that wait and on what, or the first transfer received as another.
std::string check_exchanges_under_nccl_rules(
    const std::vector<std::vector<PipeOp>>& ops,
    const std::vector<std::vector<PipeExchange>>& exchanges, int virtual_stages);

}  // namespace jumbo
