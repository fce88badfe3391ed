// A build without -DJUMBO_CUDA=ON: the CUDA backend is absent, and asking for it says so.
#include "jumbo/backend/backend.h"
#include "jumbo/config/config.h"

namespace jumbo {

std::string cuda_unsupported_kernels(const KernelRequirements&) {
  return "this jumbo was built without the CUDA backend; rebuild with cmake -DJUMBO_CUDA=ON "
         "(CUDA toolkit with NCCL)";
}

std::unique_ptr<Backend> make_cuda_backend(int) {
  throw UserError("train.device = \"cuda\": " + cuda_unsupported_kernels({}));
}

bool cuda_backend_built() { return false; }

int cuda_device_count() { return 0; }

}  // namespace jumbo
