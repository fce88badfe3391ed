#pragma once
// The device part of a backend (ggml's backend device): what a rank's device is, how much
// memory it has and holds, where arenas come from, and whether its kernels can run a model.
#include <cstddef>
#include <cstdint>
#include <string>

#include "jumbo/backend/arena.h"
#include "jumbo/backend/tensor.h"

namespace jumbo {

// What a model stage asks of the kernels, in the backend's terms (model/ fills it from its
// options; the backend knows no model).
struct KernelRequirements {
  int64_t head_dim = 0;              // attention head size
  DType compute_dtype = DType::f32;  // activations and compute weights
};

// Why the kernels of a `device` backend cannot run `r` ("" when they can). Needs no device:
// validation asks it before any device is opened, so a layout the backend cannot run is a
// one-line user error, not a kernel's exception in the first step.
std::string unsupported_kernels(Device device, const KernelRequirements& r);
// The CUDA backend's answer (in a build without it: that it is not built).
std::string cuda_unsupported_kernels(const KernelRequirements& r);

class BackendDevice {
 public:
  struct MemoryInfo {
    uint64_t used = 0, total = 0;
  };

  virtual ~BackendDevice() = default;
  virtual Device kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)"
  // Device memory in use now and in total (cudaMemGetInfo); {0, 0} for host memory.
  virtual MemoryInfo memory() const { return {}; }
  // One allocation, sized before the step loop (arena.h).
  virtual Arena make_arena(size_t bytes, const std::string& name) = 0;
  std::string unsupported(const KernelRequirements& r) const { return unsupported_kernels(kind(), r); }
};

}  // namespace jumbo
