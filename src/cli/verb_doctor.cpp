#include <fmt/format.h>

#include <memory>
#include <string>

#include "jumbo/comm/comm.h"
#include "jumbo/obs/doctor.h"
#include "verbs.h"

namespace jumbo::cli {

void add_doctor_verb(CLI::App& app, VerbRunner& run) {
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "check this node (one rank per node under srun/mpirun): MPI, EFA, GPUs, NCCL, "
                "shared file system, clock; exit 1 if a required check fails");
  cmd->add_flag("--expect-efa", options->expect_efa,
                "fail unless libfabric offers efa and NCCL's OFI plugin loads");
  cmd->add_option("--expect-gpus", options->expect_gpus, "fail unless this many GPUs are visible")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dir", options->dir, "a directory on the shared file system to write to");
  cmd->add_option("--max-clock-skew", options->max_clock_skew_s,
                  "seconds the ranks' clocks may differ")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([&run, options] {
    run = [options] {
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
