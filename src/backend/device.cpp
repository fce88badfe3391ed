#include "jumbo/backend/device.h"

namespace jumbo {

std::string unsupported_kernels(Device device, const KernelRequirements& r) {
  switch (device) {
    case Device::cpu: return "";  // the CPU kernels run every shape and dtype
    case Device::cuda: return cuda_unsupported_kernels(r);
  }
  return "unknown device";
}

}  // namespace jumbo
