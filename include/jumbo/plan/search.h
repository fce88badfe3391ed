#pragma once
// `jumbo plan`: every layout of a model on N nodes of a GPU type, the ones that fit in
// memory, and a rough step-time model to recommend one (docs/plan.md).
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/plan/memory.h"

namespace jumbo {

struct PlanRequest {
  ModelConfig model;
  GpuSpec gpu{};
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  PlanTarget target;  // device gpu, bf16, global batch, sequence length
  int64_t world() const { return nodes * gpus_per_node; }
};

struct PlanCandidate {
  Layout layout;
  MemoryEstimate memory;   // worst stage
  double bubble = 0;       // pipeline bubble fraction (p - 1) / (v m)
  double step_time_s = 0;  // estimated (docs/plan.md: compute at 60% of peak + bubble + comm)
  double mfu = 0;          // model FLOPs / (step time x GPUs x peak)
  bool fits = false;
};

// Estimated step time and MFU of one layout (fills bubble, step_time_s, mfu).
void estimate_time(const PlanRequest& r, PlanCandidate& c);
// A fully described candidate for one layout.
PlanCandidate evaluate_layout(const PlanRequest& r, const Layout& l);
// Every valid layout (tp within a node, pp, dp, micro batch, recompute, ZeRO-1), evaluated.
// `searched` gets the number considered. The result holds those that fit, largest memory first.
std::vector<PlanCandidate> search_layouts(const PlanRequest& r, int64_t* searched = nullptr);
// The candidate with the highest estimated MFU (least memory on a tie); nullptr if none.
const PlanCandidate* recommended_layout(const std::vector<PlanCandidate>& fitting);

// "--set parallel.tp=8 --set parallel.pp=16 ..." for sbatch scripts.
std::string layout_overrides(const Layout& l);
// "27.3 GiB of 40.0 GiB per A100-SXM4-40GB: weights 2.4, grads 4.9, ... (stage 0, 16
// microbatches in flight)" - why a layout fits, or by how much it does not.
std::string explain_memory(const MemoryEstimate& e, double budget_bytes, const std::string& device);
// The table `jumbo plan` prints: header, one row per candidate (at most `limit`; 0 = all),
// and the recommendation.
std::string format_plan(const PlanRequest& r, const std::vector<PlanCandidate>& fitting,
                        int64_t searched, size_t limit);

}  // namespace jumbo
