#pragma once
// `jumbo plan`: every layout of a model on N nodes of a GPU type, the ones that fit in
// memory, and a rough step-time model to recommend one (docs/plan.md).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/config/machine.h"
#include "jumbo/plan/memory.h"

namespace jumbo {

// USD per hour of one p4d.24xlarge on demand in us-east-1 (AWS EC2 on-demand pricing page, as
// of 2026-12): the default of `jumbo plan --price-per-node-hour`, whatever the --gpu.
constexpr double kP4dOnDemandUsdPerNodeHour = 32.7726;

struct PlanRequest {
  ModelConfig model;
  GpuSpec gpu{};
  // The time model's numbers: machine_of_gpu(gpu, gpus_per_node) (set_gpu), or a measured
  // description (`jumbo plan --machine FILE`, set_machine), whose ranks_per_host is
  // gpus_per_node and whose memory bounds the layouts.
  Machine machine;
  bool measured_machine = false;
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  void set_gpu(const GpuSpec& spec, int64_t per_node);
  void set_machine(const Machine& m);
  // "p4d.24xlarge" or the machine's name; "A100-SXM4-40GB" or "rank".
  std::string host_label() const;
  std::string device_label() const;
  PlanTarget target;  // device gpu, bf16, global batch, sequence length
  double tokens = 0;  // tokens to train on; 0 = no time-to-train and cost columns
  double price_per_node_hour = kP4dOnDemandUsdPerNodeHour;
  // With `jumbo plan --config`: whether the run config takes a layout on that many ranks
  // (validate's rules beyond the layout's own, e.g. train.eval_batches over dp); unset: all.
  std::function<bool(const Layout&, int64_t world)> accepts;
  int64_t world() const { return nodes * gpus_per_node; }
  int64_t seq() const { return target.seq > 0 ? target.seq : model.context; }
};

struct PlanCandidate {
  Layout layout;
  MemoryEstimate memory;   // worst stage
  double bubble = 0;       // pipeline bubble fraction (p - 1) / (v m)
  // The terms of the step time (docs/plan.md "The time model"), in seconds; step_time_s is
  // their sum.
  // compute, elementwise, recompute and tp are the slowest pipeline rank's: its layers and,
  // on the last, the head (the pipeline runs at its pace).
  double compute_s = 0;    // the model's FLOPs at the machine's GEMM and attention rates
  double elementwise_s = 0;  // norms, activation, RoPE, adds, cross-entropy at the memory bandwidth
  double recompute_s = 0;  // the forward run again (full) or the attention core (selective)
  double tp_comm_s = 0;    // tensor-parallel collectives, on the critical path
  double pp_comm_s = 0;    // the stages' transfers the schedule cannot hide (simulated)
  double bubble_s = 0;     // (compute + elementwise + recompute + tp) x bubble
  double dp_comm_s = 0;    // the part of the dp reduce-scatter / all-gather not overlapped
  double dp_total_s = 0;   // the whole dp communication (printed next to what is exposed)
  double optimizer_s = 0;  // AdamW over the rank's parameters (its shard under ZeRO-1)
  int64_t slowest_stage = 0;  // the pipeline rank whose compute the terms above are
  double step_time_s = 0;
  double mfu = 0;          // model FLOPs / (step time x GPUs x peak)
  bool fits = false;
  double comm_s() const { return tp_comm_s + dp_comm_s + pp_comm_s; }
};
// "compute 1.234 s, recompute 0, tp 0.1, pp 0.01, bubble 0.3, dp 0.05 exposed of 0.2,
// optimizer 0.02": the terms, for bench train's preflight line and `jumbo plan --terms`.
std::string describe_time_terms(const PlanCandidate& c);

// The memory-bound kernels of one layer, in b s h values each moves over the whole batch
// (docs/plan.md "The step-time model"), from the model's spec: the norm regions' (run on
// every tp rank, or on its 1/tp of the sequence under sequence parallelism), and the values
// split over tp (the MLP's activation, RoPE's rotation, qk-norm), summed over the tp ranks.
// GPT: 22 (10 forward) and 5 f/h (2 f/h); Llama: 22 (10) and 8 f/h + 4 (H + G) D / h
// (3 f/h + 2 (H + G) D / h); qk-norm adds 8 (H + G) D / h (2 forward).
struct LayerElementwise {
  double norm_regions = 0, norm_regions_forward = 0;
  double tp_split = 0, tp_split_forward = 0;
};
LayerElementwise layer_elementwise_values(const ModelConfig& m);

// Estimated step time and its terms, and MFU, of one layout (fills bubble, the *_s, mfu).
void estimate_time(const PlanRequest& r, PlanCandidate& c);
// A fully described candidate for one layout.
PlanCandidate evaluate_layout(const PlanRequest& r, const Layout& l);
// The order of the table and of the recommendation: shorter estimated step time first, then
// less memory, then the smaller tp, pp, micro batch, no recompute, no ZeRO-1 (deterministic).
bool faster_layout(const PlanCandidate& a, const PlanCandidate& b);
// Every valid layout (tp within a node, pp, dp, micro batch, recompute, ZeRO-1), evaluated.
// `searched` gets the number considered. The result holds those that fit, fastest first.
std::vector<PlanCandidate> search_layouts(const PlanRequest& r, int64_t* searched = nullptr);
// The first of `fitting` in faster_layout order; nullptr if none.
const PlanCandidate* recommended_layout(const std::vector<PlanCandidate>& fitting);

// The fewest nodes of r.gpu on which a layout fits, trying 1, 2, ... max_nodes (r.nodes is
// replaced), and search_layouts on that many.
struct FewestNodes {
  PlanRequest request;  // r with nodes = the fewest that fit, or max_nodes when none does
  bool found = false;
  int64_t searched = 0;  // layouts tried on request.nodes
  std::vector<PlanCandidate> fitting;
};
inline constexpr int64_t kFewestNodesLimit = 256;
FewestNodes search_fewest_nodes(const PlanRequest& r, int64_t max_nodes = kFewestNodesLimit);
// "fewest nodes that fit: 1 x p4de.24xlarge = 8 x A100-SXM4-80GB (tried 1 to 1)".
std::string format_fewest_nodes(const FewestNodes& f);

// What bounds a layout's step time, the first that holds (docs/plan.md "Time and cost to
// train"): memory when the fullest stage needs over 90% of the GPU's memory; else bubble or
// comm, whichever is larger, when it is at least 10% of the step time; else compute.
enum class PlanBound { compute, memory, bubble, comm };
PlanBound layout_bound(const PlanCandidate& c, double gpu_memory_bytes);
const char* to_string(PlanBound b);

// Training a layout on r.tokens tokens at r.price_per_node_hour.
struct TrainingCost {
  double steps = 0;      // tokens / (global batch x seq), rounded up to whole steps
  double days = 0;       // steps x step time / 86400
  double gpu_hours = 0;  // days x 24 x nodes x GPUs per node
  double usd = 0;        // days x 24 x nodes x price per node-hour
};
TrainingCost training_cost(const PlanRequest& r, const PlanCandidate& c);

// "--set parallel.tp=8 --set parallel.pp=16 ..." for sbatch scripts.
std::string layout_overrides(const Layout& l);
// "27.3 GiB of 40.0 GiB per A100-SXM4-40GB: weights 2.4, grads 4.9, ... (stage 0, 16
// microbatches in flight)" - why a layout fits, or by how much it does not. With a frozen
// base (LoRA) it names the base and the adapters' terms.
std::string explain_memory(const MemoryEstimate& e, double budget_bytes, const std::string& device);
// The table `jumbo plan` prints: header, one row per candidate (at most `limit`; 0 = all),
// and the recommendation; with r.tokens > 0, days, GPU-hours and cost as well.
std::string format_plan(const PlanRequest& r, const std::vector<PlanCandidate>& fitting,
                        int64_t searched, size_t limit);

}  // namespace jumbo
