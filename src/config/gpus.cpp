#include "jumbo/config/gpus.h"

namespace jumbo {

const std::vector<GpuSpec>& known_gpus() {
  static const std::vector<GpuSpec> gpus = {
      // NVLink 3 (A100) moves 300 GB/s each way, NVLink 4 (H100/H200) 450; NCCL's all-reduce
      // bus bandwidth inside a node reaches roughly 75-80% of that. HBM: NVIDIA's data sheets
      // (A100 40GB 1,555 GB/s, 80GB 2,039; H100 SXM 3,350; H200 4,800).
      {"a100-40gb", "A100-SXM4-40GB", 40960ull << 20, 312, "p4d.24xlarge", 230, 400, 1555},
      {"a100-80gb", "A100-SXM4-80GB", 81920ull << 20, 312, "p4de.24xlarge", 230, 400, 2039},
      {"h100-80gb", "H100-SXM5-80GB", 81559ull << 20, 989, "p5.48xlarge", 350, 3200, 3350},
      {"h200-141gb", "H200-SXM-141GB", 143771ull << 20, 989, "p5en.48xlarge", 350, 3200, 4800},
  };
  return gpus;
}

const GpuSpec* find_gpu(std::string_view name) {
  for (const GpuSpec& g : known_gpus())
    if (g.name == name) return &g;
  return nullptr;
}

const GpuSpec* gpu_from_device_name(std::string_view device_name, uint64_t memory_bytes) {
  // The family from the name, the variant from the memory (within 10%).
  const char* family = device_name.find("A100") != std::string_view::npos   ? "a100"
                       : device_name.find("H100") != std::string_view::npos ? "h100"
                       : device_name.find("H200") != std::string_view::npos ? "h200"
                                                                            : nullptr;
  if (!family) return nullptr;
  for (const GpuSpec& g : known_gpus()) {
    if (g.name.rfind(family, 0) != 0) continue;
    const double ratio = static_cast<double>(memory_bytes) / static_cast<double>(g.memory_bytes);
    if (ratio > 0.9 && ratio < 1.1) return &g;
  }
  return nullptr;
}

std::string known_gpu_names() {
  std::string out;
  for (const GpuSpec& g : known_gpus()) {
    if (!out.empty()) out += ", ";
    out += g.name;
  }
  return out;
}

}  // namespace jumbo
