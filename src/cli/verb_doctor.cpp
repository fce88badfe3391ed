#include <fmt/format.h>

#include <memory>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/obs/doctor.h"
#include "verbs.h"

namespace jumbo::cli {

void add_doctor_verb(CLI::App& app, VerbRunner& run) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "check this node (one rank per node under srun/mpirun): MPI, EFA, GPUs, NCCL and "
                "its network plugin, the build, shared file system, clock; exit 1 if a required "
                "check fails");
  cmd->add_flag("--expect-efa", options->expect_efa,
                "fail unless libfabric offers efa and the network plugin NCCL would load "
                "(NCCL_NET_PLUGIN) is found");
  cmd->add_option("--expect-gpus", options->expect_gpus,
                  "fail unless this many GPUs are visible, libnccl.so.2 loads and this build "
                  "has the CUDA backend")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dir", options->dir, "a directory on the shared file system to write to");
  cmd->add_option("--max-clock-skew", options->max_clock_skew_s,
                  "seconds the ranks' clocks may differ")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([&run, options] {
    run = [options] {
      options->cuda_built = cuda_backend_built();
      auto world = mpi_world();
      bool failed = false;
      const std::string report =
          gather_doctor_report(run_node_checks(*options, *world), *world, &failed);
      if (world->rank() == 0) fmt::print("{}", report);
      return failed ? 1 : 0;
    };
  });
}

}  // namespace jumbo::cli
