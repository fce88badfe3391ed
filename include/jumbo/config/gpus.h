#pragma once
// The accelerators jumbo plans for: memory as the driver reports it and dense peaks from
// the vendor's data sheets (A100: 312 TFLOP/s bf16; H100/H200 SXM: 989).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace jumbo {

struct GpuSpec {
  std::string_view name;     // the value of train.gpu and `jumbo plan --gpu`
  std::string_view label;    // what a person calls it
  uint64_t memory_bytes;     // total device memory (nvidia-smi's MiB x 2^20)
  double bf16_tflops;        // dense bf16 tensor-core peak
  std::string_view instance; // the AWS instance of 8 of them, for messages and docs
  double nvlink_bus_gbps;    // intra-node all-reduce bus bandwidth NCCL reaches, GB/s
  double node_network_gbits; // the instance's EFA bandwidth, Gbit/s per node
  double hbm_gbps;           // device memory bandwidth (data sheet), GB/s
};

const std::vector<GpuSpec>& known_gpus();
// nullptr for an unknown name.
const GpuSpec* find_gpu(std::string_view name);
// The spec of a device the driver names ("NVIDIA H200", "NVIDIA A100-SXM4-40GB") with that
// much memory; nullptr when none matches.
const GpuSpec* gpu_from_device_name(std::string_view device_name, uint64_t memory_bytes);
// "a100-40gb, a100-80gb, h100-80gb, h200-141gb", for error messages.
std::string known_gpu_names();

}  // namespace jumbo
