#pragma once
// `jumbo bench generate`: prefill and decode throughput of the generation engine on one rank
// (randomly initialised weights of a model preset), at several batch sizes, with batch-1
// decode against this machine's memory bandwidth measured in the same run: each decode step
// reads every weight once, so weight bytes per step / step time is the bandwidth it reached.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct GenerateBenchOptions {
  std::vector<int64_t> batches = {1, 8};
  int64_t prompt_tokens = 128;
  int64_t new_tokens = 32;
  int64_t repeats = 3;  // each measured this many times; the median is reported
  // Prompt rows one step may add (`--prefill-chunk` of generate and serve); 0 = every prompt
  // of the largest batch in one step, one forward as a batched framework's prefill.
  int64_t prefill_chunk = 0;
  Precision precision = Precision::fp32;
  // LoRA adapters over the one base (serve's --adapter): with adapters > 0 each batch is also
  // run with its sequences spread round-robin over that many random adapters of lora_rank on
  // every map, all in one decode batch, next to the base alone.
  int64_t adapters = 0;
  int64_t lora_rank = 16;
};

struct GenerateBenchRow {
  int64_t batch = 0;
  int64_t adapters = 0;  // the adapters the batch's sequences ran (0: the base alone)
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  double decode_step_s = 0;
};

struct GenerateBenchResult {
  std::vector<GenerateBenchRow> rows;
  double weight_bytes = 0;        // the compute copy of every weight (what a step reads)
  double copy_bytes_per_s = 0;    // measured: bytes read + written per second (STREAM copy)
  double batch1_bandwidth_fraction = 0;
};

GenerateBenchResult bench_generate(const ModelConfig& model, const GenerateBenchOptions& opts,
                                   Backend& backend, std::shared_ptr<Comm> world);
// A table, then one JSON line.
std::string describe(const GenerateBenchResult& r, const ModelConfig& model,
                     const GenerateBenchOptions& opts);

// Copy bandwidth of `bytes`-sized buffers over all OpenMP threads, best of a few passes.
double measure_copy_bytes_per_s(size_t bytes);

}  // namespace jumbo
