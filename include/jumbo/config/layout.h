#pragma once
// Layout: how one training job is cut over its ranks (torchtitan's ParallelDims). The one
// type the run config's [parallel] section, the planner, the checkpoint manifest and
// checkpoint conversion share; validate_layout (validate.cpp) holds every rule about it.
// It lives on the ground floor because config parses it and ckpt records it, and both sit
// below parallel/, which turns a layout into stage plans (parallel/stage_plan.h).
#include <cstdint>
#include <string>
#include <vector>

namespace jumbo {

// Activation recomputation (Korthikanti et al. 2022): selective keeps each layer's tensors
// but the attention core's (probabilities and output), recomputed from qkv in the backward;
// full keeps only each layer's input and recomputes the whole layer in the backward.
enum class Recompute : uint8_t { none, selective, full };
const char* to_string(Recompute r);

// Where a rank's tensors live and its kernels run: the CPU backend with MPI, or one GPU per
// rank with the CUDA backend and NCCL.
enum class Device : uint8_t { cpu, cuda };
const char* to_string(Device d);

struct Layout {
  int64_t tp = 1;  // tensor-parallel ranks (a node's GPUs)
  int64_t pp = 1;  // pipeline stages
  // Data-parallel replicas: not a config key but what the world leaves, world / (tp x pp);
  // 1 until validated_for_world() (config.h) sets it.
  int64_t dp = 1;
  int64_t micro_batch = 1;     // sequences per microbatch per data-parallel rank
  int64_t virtual_stages = 1;  // model chunks per pipeline rank (interleaved 1F1B when > 1)
  std::vector<int64_t> stage_layers;  // layers per pipeline stage; empty = balanced by jumbo
  bool sequence_parallel = false;     // norms and residuals split along the sequence over tp
  Recompute recompute = Recompute::none;
  bool zero1 = false;  // distributed optimizer: each dp rank owns 1/dp of Adam's state
  int64_t bucket_size = 40'000'000;  // data-parallel gradient bucket, in elements (Megatron's)
  Device device = Device::cpu;

  int64_t world_size() const { return tp * pp * dp; }
  // What is in effect: ZeRO-1 needs data parallelism, sequence parallelism tensor parallelism.
  bool zero1_active() const { return zero1 && dp > 1; }
  bool sequence_parallel_active() const { return sequence_parallel && tp > 1; }
  // "tp 8 x pp 16 x dp 4, micro batch 1, recompute full, ZeRO-1, sequence parallel"
  std::string describe() const;
};

}  // namespace jumbo
