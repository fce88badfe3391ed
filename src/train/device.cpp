#include "jumbo/train/device.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "jumbo/config/config.h"

namespace jumbo {

int local_rank_from_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      char* end = nullptr;
      const long rank = std::strtol(v, &end, 10);
      if (*end == '\0' && rank >= 0) return static_cast<int>(rank);
    }
  }
  return 0;
}

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") return make_cuda_backend(local_rank_from_launcher());
  throw UserError(fmt::format("train.device = \"{}\": expected \"cpu\" or \"cuda\"", device));
}

std::shared_ptr<Comm> make_world_comm(Backend& backend) {
  if (backend.device() == Device::cpu) return mpi_world();
  return make_nccl_comm(mpi_world(), backend.stream());
}

}  // namespace jumbo
