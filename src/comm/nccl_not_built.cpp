// A build without -DJUMBO_CUDA=ON has no NCCL communicators, and asking for one says so.
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"

namespace jumbo {

std::shared_ptr<Comm> make_nccl_comm(std::shared_ptr<Comm>, Stream&) {
  throw UserError("NCCL communicators: this jumbo was built without CUDA; rebuild with cmake "
                  "-DJUMBO_CUDA=ON (CUDA toolkit with NCCL)");
}

bool nccl_built() { return false; }

}  // namespace jumbo
