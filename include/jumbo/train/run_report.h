#pragma once
// What a run works out and says about itself before its first step: the memory plan of its
// layout (refused if it cannot fit train.gpu), the peak its MFU is measured against, and the
// lines rank 0 prints about the model, the layout and the pipeline.
#include <cstdint>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

// Estimated bytes per rank of the layout's fullest stage (docs/plan.md): on the GPU model,
// and on the CPU backend (what a CPU run compares its measured peak with). Throws UserError
// naming train.gpu if the layout cannot fit it; `fit_line` then says why it fits.
struct PlannedMemory {
  double cpu_bytes = 0, gpu_bytes = 0;
  std::string fit_line;  // empty without train.gpu
};
PlannedMemory plan_memory(const RunConfig& cfg);

// The per-device peak for MFU: log.peak_tflops, the bf16 peak of train.gpu or of the GPU the
// CUDA backend runs on, or this machine's measured fp32 peak; `source` says which.
struct Peak {
  double tflops = 0;
  const char* source = "";
};
Peak run_peak(const RunConfig& cfg, Backend& backend);

// "model NAME: 8 layers, d_model 512, ...; 14.81M parameters"
std::string model_line(const RunConfig& cfg, int64_t padded_vocab);
// "layout tp 2 x pp 2 x dp 2 on 8 ranks, ZeRO-1, recompute none; cpu fp32; memory per rank: ..."
struct StageBytes {
  double params = 0, optimizer = 0, activations = 0;
};
std::string layout_line(const RunConfig& cfg, const StageBytes& bytes, const std::string& backend,
                        const Peak& peak);
// "pipeline: 2 stages, layers per stage 4 4 (...), 1F1B, 12 microbatches per step"
std::string pipeline_line(const RunConfig& cfg, const StagePlan& plan);

}  // namespace jumbo
