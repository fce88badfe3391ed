#pragma once
// `jumbo doctor`: checks a node can run a training job before GPU hours are spent on it:
// libfabric providers and EFA devices, GPUs (and DCGM's quick diagnostic), NCCL and the
// network plugin NCCL would load, the build, the shared file system (node-local checks),
// then MPI and the clock across the ranks (collective checks).
//
// The node-local checks need no MPI and no other node: each one that can hang (a GPU stuck
// in cuInit, a libfabric provider that never returns, a hung file system) runs in a child
// process killed at its timeout, so a bad node always produces its own result line, naming
// itself. The batch job (slurm/doctor.sh) runs them first on every node, one task a node,
// then the collective checks only where every node passed.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/comm/comm.h"

namespace jumbo {

struct DoctorCheck {
  enum class Status { ok, warn, fail, skip };
  // Whose fault a failure is: the node's (a GPU or EFA device missing or hung, the clock:
  // drain it, another node will do) or the software's and settings' (NCCL, its plugin, the
  // build, the directory: every node fails alike, so replacing nodes does not help).
  enum class Fault { node, software };
  std::string name;    // "node", "libfabric", "gpu", "nccl", "nccl-net", "build", "storage", ...
  Status status = Status::ok;
  std::string detail;  // one line
  Fault fault = Fault::node;
};

struct DoctorOptions {
  bool expect_efa = false;   // the efa provider, its devices and NCCL's network plugin are required
  int expect_gpus = 0;       // this many GPUs per node are required; 0 = report only
  std::string dir;           // a directory on the shared file system to write; "" = skip
  double max_clock_skew_s = 1.0;  // between ranks, above which the clock check fails
  bool cuda_built = false;   // this binary has the CUDA backend (required with expect_gpus > 0)
  double check_timeout_s = 60;    // each node-local check; past it the check failed ("hung")
  // "p4d.24xlarge": sets how many EFA devices the node must have; "" = read DMI's product
  // name (EC2 Nitro instances report their type there); unknown types: counted, not required.
  std::string instance_type;
};

// The name Slurm knows this node by (SLURMD_NODENAME; ParallelCluster's differ from host
// names): what a script drains. Outside Slurm, the host name.
std::string doctor_node_name();

// This node's checks, without MPI: node, libfabric (with the EFA device count), gpu, nccl,
// nccl-net, build, storage, dcgm. Each that can hang runs in a child process (see
// run_isolated_checks) under options.check_timeout_s.
std::vector<DoctorCheck> run_local_checks(const DoctorOptions& options);
// Collective over `world`: node (rank 0's report names its node), mpi, clock (the ranks'
// wall clocks compared).
std::vector<DoctorCheck> run_collective_checks(const DoctorOptions& options, Comm& world);

// "ok    libfabric  ..." (status, name, detail), no host.
std::string format_check(const DoctorCheck& check);
// "doctor: failed node=NAME node-checks=gpu,libfabric software-checks=nccl" ("-" for an
// empty list), or "" when no check failed. No newline.
std::string failed_node_line(const std::vector<DoctorCheck>& checks, const std::string& node);
// One node's report: its check lines, then the failed-node line or "doctor: passed node=NAME".
std::string local_report(const std::vector<DoctorCheck>& checks, const std::string& node);
// Writes `report` to DIR/NODE.txt atomically (a temporary file, fsync, rename): a reader
// sees the whole report or none. Throws UserError naming the file when it cannot.
void write_local_report(const std::string& dir, const std::string& node, const std::string& report);

// Collective: rank 0 returns the report (its node's lines, then every other node's
// warnings and failures, then a summary, then one failed-node line per failed node for
// scripts); the others return "". `failed` is true on every rank when any node failed.
std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed);

// One or more checks that run together in a child process of their own.
struct IsolatedCheck {
  std::vector<std::string> names;  // the checks `run` returns, in order (for a hung result)
  DoctorCheck::Fault fault = DoctorCheck::Fault::node;  // whose fault a hang or crash is
  std::string waits_on;            // what a hang is stuck in: "cuInit (the GPU driver)"
  std::function<std::vector<DoctorCheck>()> run;
};
// Starts every check in its own child process (its own process group) at once and waits at
// most timeout_s for all: a child still running then is killed with its group and each of its
// checks fails "hung after N s"; a child that crashes fails "ended by signal N". Results in
// the order given.
std::vector<DoctorCheck> run_isolated_checks(const std::vector<IsolatedCheck>& checks,
                                             double timeout_s);

// The ncclNetPlugin_vN symbols NCCL of this version (ncclGetVersion's code, 22304 for 2.23.4)
// looks for, newest first tried; version 0 (unknown) = the newest NCCL's range.
struct NetPluginRange {
  int oldest = 0;
  int newest = 0;
};
NetPluginRange nccl_net_plugin_range(int nccl_version);
// EFA devices an instance type has (4 on p4d.24xlarge, 32 on p5.48xlarge); 0 = unknown type.
int efa_devices_expected(std::string_view instance_type);
// RDMA devices under `infiniband_class_dir` (/sys/class/infiniband) bound to the efa driver.
int count_efa_devices(const std::string& infiniband_class_dir);

}  // namespace jumbo
