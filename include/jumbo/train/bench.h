#pragma once
// `jumbo bench train`: full training steps (forward, backward, AdamW) of a model on synthetic
// tokens, reported against this machine's measured peak. A benchmark, not a test.
#include <cstdint>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"

namespace jumbo {

struct TrainBenchOptions {
  int64_t micro_batch = 8;
  int64_t seq = 128;
  int64_t micro_steps = 1;  // gradient accumulation per step
  int64_t warmup_steps = 1;
  int64_t steps = 3;
  Precision precision = Precision::fp32;
  double peak_tflops = 0;   // 0: the GPU's bf16 peak, or this machine's measured fp32 peak
  Device device = Device::cpu;  // for the report; the backend is the caller's
};

struct TrainBenchResult {
  double step_time_s = 0;       // median over the timed steps
  double tokens_per_s = 0;
  double model_tflops = 0;      // achieved model TFLOP/s
  double peak_tflops = 0;
  double mfu = 0;
  double flops_per_step = 0;
  int64_t parameters = 0;
  double loss_first = 0, loss_last = 0;
};

TrainBenchResult bench_train(const ModelConfig& model, const TrainBenchOptions& opts,
                             Backend& backend);
std::string describe(const TrainBenchResult& r, const ModelConfig& model,
                     const TrainBenchOptions& opts);

}  // namespace jumbo

namespace jumbo {

// `jumbo bench ckpt`: save and load of one rank's checkpoint state for a model and layout
// (this process's place in a tp x pp x dp grid over the MPI world), against a plain write of
// the same bytes to the same directory in the same run (the disk's own speed).
struct CkptBenchOptions {
  std::string dir;  // a directory (local disk) or s3:// prefix
  Layout layout;    // tp, pp and zero1 from the flags; dp is what the world leaves
  bool async = false;
  int64_t repeats = 3;
};

struct CkptBenchResult {
  int64_t bytes_per_rank = 0;    // this rank's shard (rank 0)
  int64_t bytes_total = 0;       // every rank's shards
  double save_s = 0;             // median; until the manifest is written
  double blocked_s = 0;          // median time training would wait (the snapshot if async)
  double load_s = 0;             // median; shards evicted from the page cache first
  double raw_write_s = 0;        // median: the same bytes written with fsync, no HDF5
};

CkptBenchResult bench_checkpoint(const ModelConfig& model, const CkptBenchOptions& opts,
                                 Comm& world);
std::string describe(const CkptBenchResult& r, const CkptBenchOptions& opts, int world_size);

}  // namespace jumbo
