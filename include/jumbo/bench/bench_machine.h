#pragma once
// `jumbo bench comm --write-machine FILE`: a machine description (config/machine.h) measured
// on the ranks of this launch, for `jumbo plan --machine FILE`: every rank's compute rates
// measured at once (what a rank gets while its neighbours on the host compute too), and the
// collective curves of bench comm's rows, each group classed by whether its ranks share a
// host (intra) or not (inter).
#include <memory>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/bench/bench_comm.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/machine.h"

namespace jumbo {

struct ComputeRates {
  double peak_flops = 0;  // the FMA loop (runtime/peak.h) on this rank's threads
  // linear_fwd and linear_bwd (FLOP/s) at each row count of gemm_rows, of a training layer's
  // width (CPU: 512 -> 2048 in f32; GPU: 4096 -> 16384 in bf16).
  std::vector<double> gemm_rows, gemm_forward_flops, gemm_backward_flops;
  // attention_fwd and _bwd at each sequence length x head size (attention_seq-major), FLOPs
  // as model/flops.h counts them.
  std::vector<double> attention_seq, attention_head_dim;
  std::vector<double> attention_forward_flops, attention_backward_flops;
  double memory_bandwidth = 0;  // bytes/s of a streaming add of three 64 MiB arrays
};
// This rank's rates, measured for about `seconds` in all.
ComputeRates measure_compute(Backend& backend, double seconds);

// The description: the peak averaged over the world's ranks, every other rate the slowest
// rank's (a step waits for it), ranks per host and memory per rank from rank 0's host, collective points from `rows` (bench_comm's, whose one_host says
// the level). Collective: every rank calls it; rank 0's result is the one to write.
Machine measure_machine(const std::vector<CommBenchRow>& rows, Backend& backend, Comm& world,
                        const std::string& command);

}  // namespace jumbo
