#include <fmt/format.h>

#include <memory>
#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/obs/doctor.h"
#include "verbs.h"

namespace jumbo::cli {

namespace {
struct DoctorArgs {
  DoctorOptions options;
  bool local = false;       // node-local checks only, no MPI, a report per node
  bool collective = false;  // the collective checks only (after --local passed everywhere)
  std::string report_dir;   // --local: DIR/NODE.txt
};
}  // namespace

void add_doctor_verb(CLI::App& app, VerbRunner& run) {
  auto args = std::make_shared<DoctorArgs>();
  DoctorOptions& options = args->options;
  CLI::App* cmd = app.add_subcommand(
      "doctor", "check this node (one task per node under srun/mpirun): EFA, GPUs (and DCGM), NCCL "
                "and its network plugin, the build, shared file system (each under a timeout, in "
                "a child process), then MPI and the clock; exit 1 if a required check fails");
  cmd->add_flag("--expect-efa", options.expect_efa,
                "fail unless libfabric offers efa with the instance type's EFA devices and the "
                "network plugin NCCL would load (NCCL_NET_PLUGIN) is found");
  cmd->add_option("--expect-gpus", options.expect_gpus,
                  "fail unless this many GPUs are visible, libnccl.so.2 loads and this build "
                  "has the CUDA backend")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dir", options.dir, "a directory on the shared file system to write to");
  cmd->add_option("--max-clock-skew", options.max_clock_skew_s,
                  "seconds the ranks' clocks may differ")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--check-timeout", options.check_timeout_s,
                  "seconds each node-local check may take; a check still running then failed "
                  "(\"hung\")")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--instance-type", options.instance_type,
                  "the EC2 instance type, for the EFA device count (p4d.24xlarge: 4, "
                  "p5.48xlarge: 32); default: DMI's product name on EC2");
  auto* local = cmd->add_flag(
      "--local", args->local,
      "node-local checks only, without MPI or any other node: the report on stdout and, with "
      "--report-dir, in DIR/NODE.txt (NODE: SLURMD_NODENAME, else the host name). MPI is "
      "never started, however jumbo was launched");
  cmd->add_option("--report-dir", args->report_dir,
                  "with --local: a directory (on the shared file system) for this node's report")
      ->needs(local);
  cmd->add_flag("--collective", args->collective,
                "the collective checks only (node, MPI, the ranks' clocks), after --local passed")
      ->excludes(local);
  cmd->callback([&run, args] {
    run = [args] {
      DoctorOptions& o = args->options;
      o.cuda_built = cuda_backend_built();
      if (args->local) {
        const std::string node = doctor_node_name();
        const std::vector<DoctorCheck> checks = run_local_checks(o);
        const std::string report = local_report(checks, node);
        fmt::print("{}", report);
        std::fflush(stdout);
        if (!args->report_dir.empty()) write_local_report(args->report_dir, node, report);
        return failed_node_line(checks, node).empty() ? 0 : 1;
      }
      auto world = mpi_world();
      std::vector<DoctorCheck> mine;
      if (!args->collective) mine = run_local_checks(o);
      const std::vector<DoctorCheck> collective = run_collective_checks(o, *world);
      // One node line: the local checks' when they ran.
      for (const DoctorCheck& c : collective)
        if (c.name != "node" || mine.empty()) mine.push_back(c);
      bool failed = false;
      const std::string report = gather_doctor_report(mine, *world, &failed);
      if (world->rank() == 0) fmt::print("{}", report);
      return failed ? 1 : 0;
    };
  });
}

}  // namespace jumbo::cli
