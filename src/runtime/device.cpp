#include "jumbo/runtime/device.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "jumbo/comm/nccl_log.h"
#include "jumbo/config/config.h"
#include "jumbo/model/stage.h"

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

std::unique_ptr<Backend> make_backend(Device device) {
  switch (device) {
    case Device::cpu: return make_cpu_backend();
    case Device::cuda: return make_cuda_backend(local_rank_from_launcher());
  }
  throw std::logic_error("make_backend: unknown device");
}

void check_device_supports(const RunConfig& cfg, const StageOptions& stage, Device device) {
  if (device == Device::cuda && !cuda_backend_built()) {
    throw UserError(fmt::format("{}: train.device = \"cuda\": {}", cfg.source,
                                unsupported_kernels(device, {})));
  }
  const std::string why = unsupported_kernels(device, kernel_requirements(cfg.model, stage));
  if (why.empty()) return;
  throw UserError(fmt::format("{}: train.device = \"{}\": {} (this run's model.d_model = {}, "
                              "model.heads = {})",
                              cfg.source, to_string(device), why, cfg.model.d_model,
                              cfg.model.heads));
}

std::shared_ptr<Comm> make_world_comm(Backend& backend, CommEmulation emulate) {
  if (backend.device().kind() == Device::cpu) {
    std::shared_ptr<Comm> world = mpi_world();
    // One rank has nothing to emulate (and its world may not be MPI's at all).
    if (emulate == CommEmulation::nccl && world->size() > 1) return make_nccl_rules_comm(world);
    return world;
  }
  if (emulate != CommEmulation::none) {
    // A run config's comm.emulate was refused at validation; this is --comm-emulate's.
    throw UserError(fmt::format("--comm-emulate {} with --device cuda: expected none (a GPU run "
                                "uses NCCL itself)", to_string(emulate)));
  }
  return make_nccl_comm(mpi_world(), backend.stream());
}

std::string require_nccl_network(const RunConfig& cfg, Backend& backend, Comm& world) {
  if (backend.device().kind() != Device::cuda) return "";
  const NcclNetCensus net = check_nccl_network(world, cfg.comm.expect_network);
  if (!net.refusal.empty()) {
    if (world.rank() == 0) throw UserError(net.refusal);
    world.barrier();  // never returns: rank 0's error aborts every rank
  }
  return net.line;
}

}  // namespace jumbo
