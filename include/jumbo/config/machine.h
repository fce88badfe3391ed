#pragma once
// A machine description: what the planner's time model (plan/search.h) needs to know of a
// cluster, for GPUs (from data sheets, machine_of_gpu) or for any machine measured by
// `jumbo bench peak --write-machine` and `jumbo bench comm --write-machine` (a TOML file,
// docs/plan.md "Machine descriptions"), so one model predicts a CPU test cluster and a GPU one.
//
// Two levels of network: `intra` between ranks of one host (NVSwitch, shared memory) and
// `inter` between hosts (EFA, a shaped veth). Each collective's cost is a curve of seconds
// against bus bytes (S x the bus bandwidth factor of nccl-tests, below), measured points
// interpolated, or latency + bus bytes / bus bandwidth where only those two are known.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/config/gpus.h"
#include "jumbo/config/layout.h"

namespace jumbo {

enum class Collective { all_reduce, reduce_scatter, all_gather, p2p };
inline constexpr Collective kCollectives[] = {Collective::all_reduce, Collective::reduce_scatter,
                                              Collective::all_gather, Collective::p2p};
const char* to_string(Collective c);
// nccl-tests' bus bandwidth factor (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) of a
// collective over n ranks: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n,
// point-to-point 1. busbw = algbw x factor; bus bytes = S x factor.
double bus_bandwidth_factor(Collective c, int64_t n);

struct CollectiveCost {
  double latency_s = 0;  // the cost of a collective of (nearly) no bytes
  double busbw = 0;      // bytes per second of bus bytes at large sizes
  // Measured (bus bytes, seconds), bus bytes increasing; when present they decide, linearly
  // interpolated in log-log and extrapolated at the largest point's bus bandwidth.
  std::vector<std::pair<double, double>> points;
  bool known() const { return busbw > 0 || !points.empty(); }
  // Seconds of one collective moving S bytes (all-gather: the gathered output) over n ranks.
  double seconds(Collective c, double bytes, int64_t n) const;
};

// How a collective is called: blocking (tp's all-reduces on the critical path, pp's sends), or
// the data-parallel gradient and weight buckets' non-blocking calls (train/grad_sync.cpp). On
// NCCL the two are the same kernels; on MPI the buckets run jumbo's own rings on a worker
// thread (comm/mpi_ring.h) and the blocking calls Open MPI's tuned collectives, which differ.
enum class CommPath { blocking, bucketed };

struct LinkCosts {
  CollectiveCost all_reduce, reduce_scatter, all_gather, p2p;
  // The bucketed path's (no p2p); unknown: the blocking path's costs stand for it.
  CollectiveCost bucket_all_reduce, bucket_reduce_scatter, bucket_all_gather;
  const CollectiveCost& of(Collective c, CommPath path = CommPath::blocking) const;
  CollectiveCost& of(Collective c, CommPath path = CommPath::blocking);
};
// "all_reduce", or "bucket_all_reduce" for the bucketed path: the TOML table's name.
std::string cost_name(Collective c, CommPath path);

enum class NetLevel { intra, inter };
const char* to_string(NetLevel l);

// A training step's two passes: a GEMM's or the attention core's forward (a third of its
// FLOPs) and backward (two thirds: the inputs' and the weights' gradients).
enum class Pass { forward, backward };

// GEMM efficiency (share of peak) by the GEMM's rows, a microbatch's tokens, forward and
// backward apart, as measured (jumbo bench comm --write-machine): a CPU's small GEMMs run a
// different kernel forward than backward, and every machine's efficiency falls with rows.
// Interpolated linearly in log(rows), held flat beyond the ends.
struct GemmCurve {
  std::vector<double> rows, forward, backward;  // rows increasing; one efficiency per row count
  bool empty() const { return rows.empty(); }
  double efficiency(double at_rows, Pass pass) const;
};

// The attention core's efficiency by sequence length and head size, forward and backward
// apart, as measured: its FLOPs grow with s^2 d, its gathers and softmax with s, so short
// sequences and small heads run well below long ones. Bilinear in log(seq) and log(head size),
// held flat beyond the ends.
struct AttentionTable {
  std::vector<double> seq, head_dim;      // increasing
  std::vector<double> forward, backward;  // [i * head_dim.size() + j] for seq[i], head_dim[j]
  bool empty() const { return seq.empty(); }
  double efficiency(double at_seq, double at_head_dim, Pass pass) const;
};

struct Machine {
  std::string name;    // "p4d.24xlarge", "host1,host2 (tc 1 Gbit/s)"
  std::string source;  // where the numbers come from (data sheets, the commands that measured)
  int64_t ranks_per_host = 8;  // ranks (GPUs) of one host: the intra level
  double peak_flops = 0;       // per rank, dense, in the training dtype
  double gemm_efficiency = 0.6;  // share of peak a training step's GEMMs sustain
  // Share of peak the attention core (q k^T, softmax, p v; forward and backward) sustains,
  // its FLOPs counted as the model's (causal at half, model/flops.h): flash attention on a
  // GPU, the reference kernel on a CPU, both well below the GEMMs'.
  double attention_efficiency = 0.4;
  // Measured by shape (empty: gemm_efficiency, attention_efficiency at any shape and pass).
  GemmCurve gemm_by_rows;
  AttentionTable attention_by_shape;
  // FLOP/s per rank of a pass of GEMMs with `rows` rows, and of the attention core over
  // sequences of `seq` tokens with heads of `head_dim`.
  double gemm_rate(double rows, Pass pass) const;
  double attention_rate(double seq, double head_dim, Pass pass) const;
  double memory_bytes = 0;       // per rank
  double memory_bandwidth = 0;   // bytes/s per rank: the optimizer step reads and writes it
  // The share of a collective's time that can hide behind computation running at the same
  // time: 1 where they use different engines (a GPU's SMs and NCCL's copies), 0 where one
  // core does both (a CPU rank per core: the ring's thread takes the core from the GEMMs).
  double overlap = 1;
  Device device = Device::cuda;  // what the ranks compute on: the memory model's target
  LinkCosts intra, inter;
  // Seconds of one collective on `level`; throws UserError naming the machine and the level
  // when the description has no numbers for it (a file measured on one host has no inter).
  double seconds(NetLevel level, Collective c, double bytes, int64_t n,
                 CommPath path = CommPath::blocking) const;
  const LinkCosts& link(NetLevel level) const { return level == NetLevel::intra ? intra : inter; }
  LinkCosts& link(NetLevel level) { return level == NetLevel::intra ? intra : inter; }
};

// A GPU cluster of spec's nodes (8 GPUs per host), each number from a data sheet or
// published measurement named in Machine::source and in gpus.cpp.
Machine machine_of_gpu(const GpuSpec& spec, int64_t gpus_per_node);
// Reads a machine TOML; throws UserError naming the file, key and value on anything wrong.
Machine load_machine(const std::string& path);
// The TOML load_machine reads (what --write-machine writes).
std::string machine_toml(const Machine& m);

}  // namespace jumbo
