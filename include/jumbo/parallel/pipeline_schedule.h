#pragma once
// Pipeline schedules as pure functions: the exact order of forward and backward operations
// each pipeline rank executes in one step (1F1B, or Megatron's interleaved 1F1B with virtual
// stages), the point-to-point transfers each operation implies, and an idealised timeline
// of a whole step that measures the bubble and proves the orders cannot deadlock.
// No MPI and no model here: PipelineRunner executes the list, docs/pipeline.md explains it.
#include <string>
#include <vector>

namespace jumbo {

// One unit of work on a pipeline rank: the forward or backward of one microbatch through
// one model chunk. Chunk c of rank r holds virtual stage c * p + r (Megatron's assignment:
// the layers are cut into p * v chunks and rank r holds chunks r, r + p, r + 2p, ...).
struct PipeOp {
  enum Kind { forward, backward } kind;
  int microbatch;
  int chunk;  // 0 .. v-1; always 0 without interleaving
  bool operator==(const PipeOp&) const = default;
};

// Virtual stage held by chunk `chunk` of pipeline rank `stage`, and the rank owning one.
int virtual_stage(int stage, int chunk, int stages);
int owner_of(int virtual_stage, int stages);

// Training runs forwards and backwards; evaluation and inference only the forwards, in the
// order the training schedule runs them (Megatron's forward_only).
enum class PipelineMode { train, forward_only };

// The operations pipeline rank `stage` (r) of `stages` (p) runs for `microbatches` (m)
// microbatches through `virtual_stages` (v) chunks per rank, in order.
//  v == 1: 1F1B (PipeDream-Flush): min(p - r - 1, m) warm-up forwards, then alternate one
//          forward and one backward, then the remaining backwards.
//  v > 1:  Megatron-LM's interleaved 1F1B: forwards walk the microbatches in groups of p
//          per chunk (chunk 0 for microbatches 0..p-1, chunk 1 for the same, ..., then the
//          next group), backwards likewise with the chunks reversed; warm-up
//          min(2 (p - r - 1) + (v - 1) p, m v) forwards. Requires m % p == 0.
// Throws std::invalid_argument (one line) on p < 1, r outside [0, p), m < 1, v < 1, or an
// interleaved m that is not a multiple of p; the config validator turns it into a UserError.
// forward_only: the m v forwards alone, in the same order.
std::vector<PipeOp> pipeline_schedule(int stages, int stage, int microbatches, int virtual_stages,
                                      PipelineMode mode = PipelineMode::train);

// Number of warm-up forwards rank `stage` runs before its first backward.
int pipeline_warmup_forwards(int stages, int stage, int microbatches, int virtual_stages);

// Largest number of (microbatch, chunk) activation sets held at once while running `ops`
// (forwards done minus backwards done): what the trainer sizes its activation buffers by.
// 1F1B: min(p - r, m). Interleaved: min(warm-up + 1, m v) chunk-sized sets.
int max_in_flight(const std::vector<PipeOp>& ops);

// The point-to-point traffic an operation implies. A forward of virtual stage s receives its
// input from s - 1 (or reads the tokens when s == 0) and sends its output to s + 1 (or
// computes the loss on the last virtual stage). A backward receives the output gradient
// from s + 1 (or starts from the loss) and sends the input gradient to s - 1 (none on 0).
// Ranks are pipeline ranks (0 .. p-1); -1 means no transfer.
struct PipeOpComm {
  int virtual_stage;
  int recv_from_rank = -1;
  int send_to_rank = -1;
  bool reads_tokens = false;   // forward of virtual stage 0
  bool computes_loss = false;  // forward of the last virtual stage; its backward starts there
};
PipeOpComm pipeline_op_comm(const PipeOp& op, int stages, int stage, int virtual_stages);

// ---- Idealised timeline ----------------------------------------------------------------

struct PipeInterval {
  PipeOp op;
  double start, end;
};

struct Timeline {
  int stages = 0, microbatches = 0, virtual_stages = 1;
  double t_forward = 0, t_backward = 0;       // per microbatch through a whole rank's layers
  std::vector<std::vector<PipeInterval>> busy;  // per rank, in execution order
  double makespan = 0;
  double bubble_fraction = 0;                 // 1 - busy time / (p * makespan)
};

// A transfer between two ranks' stages: one microbatch's activations or their gradients.
// It starts once its send is issued (the sender's op ended) and its receive is posted (the
// receiver's previous op ended: PipelineRunner posts each op's receive after the op before
// it) and arrives `seconds` later. With needs_sender_progress it also waits for the sender to
// be between ops: MPI on CPUs moves a rendezvous send only inside the sender's calls, which
// PipelineRunner makes between its ops; NCCL's run on the GPU while the host computes.
struct PipeTransfer {
  double seconds = 0;
  bool needs_sender_progress = false;
};

// Runs every rank's pipeline_schedule with its data dependencies: a forward of virtual stage
// s for microbatch k starts after the forward of s - 1 for k has ended and its output arrived;
// a backward of s for k after the backward of s + 1 for k (and its gradient's arrival) and
// the forward of s for k. Each rank runs its ops in schedule order, one at a time, as early
// as they can start; an op of one chunk costs t / v; transfers cost `transfer` (free by
// default). Throws std::logic_error naming the stuck ranks and the ops they wait on if no
// rank can proceed (a deadlock of the real non-blocking send/recv trainer).
Timeline simulate_pipeline(int stages, int microbatches, int virtual_stages, double t_forward,
                           double t_backward, PipeTransfer transfer = {});
// The same for explicitly given per-rank orders (ops[r] for rank r), e.g. a trainer's own.
Timeline simulate_pipeline(const std::vector<std::vector<PipeOp>>& ops, int virtual_stages,
                           double t_forward, double t_backward, PipeTransfer transfer = {});

// Closed form of the simulated bubble (docs/pipeline.md derives it):
// (p - 1) / (v m + p - 1); v == 1 is 1F1B's (p - 1) / (m + p - 1).
double pipeline_bubble_fraction(int stages, int microbatches, int virtual_stages);

// ASCII chart: one line per rank, "rank R |" then `columns` cells spanning the makespan.
// An op's cells start with its label, then '-' ('.' is idle). The label is F or B and the
// microbatch; with v == 2 chunk 1 is lower case (f3, b3); with v > 2 the chunk follows a dot
// (F3.2). A label longer than its op's cells is cut.
std::string render_timeline(const Timeline& timeline, int columns);

}  // namespace jumbo
