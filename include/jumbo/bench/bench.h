#pragma once
// `jumbo bench train`: full training steps (forward, backward, AdamW) of a model on synthetic
// tokens, reported against this machine's measured peak. A benchmark, not a test.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/plan/search.h"

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

// `jumbo bench train --config RUN.toml`: the run's own model and layout (cfg.parallel, e.g.
// the overrides of `jumbo plan --best`) on every rank of the MPI world, for a few full steps
// of cfg.train.global_batch on synthetic tokens (no data files, no checkpoint), timed against
// the plan's step-time estimate for that layout (plan/search.h, estimate_time). What
// slurm/preflight.sh runs before a real run; the ratio line is what the time model is fitted to.
struct RunBenchOptions {
  int64_t warmup_steps = 1;
  int64_t steps = 3;
  // The plan's request, as `jumbo plan --config` builds it: the GPU type (empty: train.gpu,
  // else a100-40gb, as slurm/common.sh's jumbo_choose_layout), nodes x GPUs per node = world.
  std::string gpu;
  int64_t nodes = 1;
  int64_t gpus_per_node = 0;  // 0: world size / nodes
  // A machine description (config/machine.h) for the estimate instead of the GPU's data
  // sheet: its ranks_per_host is the ranks per node; a CPU run gets an estimate too.
  std::string machine;
};

struct RunBenchResult {
  double step_time_s = 0;  // median over the timed steps of the slowest rank's step
  std::vector<double> step_times_s;  // the slowest rank's, per timed step
  // The plan's estimate of this layout: on a GPU run from the GPU type's data sheet, on any
  // run from --machine's description (a CPU run without one has none).
  bool has_plan = false;
  double plan_step_time_s = 0;
  std::string gpu;          // the GPU type or machine description the estimate is for
  std::string plan_terms;   // describe_time_terms (plan/search.h): the estimate's parts
  Layout layout;            // as validated for the world (dp set)
  Device device = Device::cpu;
  int world = 1;
  double loss_first = 0, loss_last = 0;
  std::string network_line;  // a GPU run: "NCCL network: 16 of 16 ranks efa (...)"
};

// The plan's estimate for cfg's layout (validated for nodes x gpus_per_node ranks) on `gpu`:
// the request `jumbo plan --config` builds (model, global batch, precision of the config,
// sequence model.context, the GPU time model), evaluated for that one layout.
PlanCandidate planned_step(const RunConfig& cfg, const GpuSpec& gpu, int64_t nodes,
                           int64_t gpus_per_node);
// The same on a machine description (its ranks per host; the CPU memory model on a CPU one).
PlanCandidate planned_step(const RunConfig& cfg, const Machine& machine, int64_t nodes);
RunBenchResult bench_run(const RunConfig& cfg, const RunBenchOptions& opts, Backend& backend,
                         std::shared_ptr<Comm> world);
// "tp2,pp1,dp2,mb1,vs1,recompute=none,zero1=0,sp=0": no blanks, for key=value parsers.
std::string layout_token(const Layout& l);
// The lines rank 0 prints; the last is machine-readable (slurm/preflight.sh, issue 25):
// "preflight: step measured=1.234s plan=0.987s ratio=1.250 layout=... device=cuda gpu=..."
// and on a CPU run "plan=na ratio=na" with the reason.
std::string describe(const RunBenchResult& r, const RunConfig& cfg, const RunBenchOptions& opts);

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
