#pragma once
// `jumbo doctor`: checks a node can run a training job before GPU hours are spent on it:
// MPI, libfabric providers (is EFA there?), GPUs, NCCL and the network plugin NCCL would
// load, the build, the shared file system, the clock. Run one rank per node; rank 0 prints.
#include <string>
#include <vector>

#include "jumbo/comm/comm.h"

namespace jumbo {

struct DoctorCheck {
  enum class Status { ok, warn, fail, skip };
  // Whose fault a failure is: the node's (a GPU or EFA device missing, the clock: drain it,
  // another node will do) or the software's and settings' (NCCL, its plugin, the build, the
  // directory: every node fails alike, so replacing nodes does not help).
  enum class Fault { node, software };
  std::string name;    // "mpi", "libfabric", "gpu", "nccl", "nccl-net", "build", "storage", ...
  Status status = Status::ok;
  std::string detail;  // one line
  Fault fault = Fault::node;
};

struct DoctorOptions {
  bool expect_efa = false;   // the efa provider and NCCL's network plugin are required
  int expect_gpus = 0;       // this many GPUs per node are required; 0 = report only
  std::string dir;           // a directory on the shared file system to write; "" = skip
  double max_clock_skew_s = 1.0;  // between ranks, above which the clock check fails
  bool cuda_built = false;   // this binary has the CUDA backend (required with expect_gpus > 0)
};

// This node's checks. Collective over `world` (the clock check compares the ranks).
std::vector<DoctorCheck> run_node_checks(const DoctorOptions& options, Comm& world);
// "ok    libfabric  ..." (status, name, detail), no host.
std::string format_check(const DoctorCheck& check);
// Collective: rank 0 returns the report (its node's lines, then every other node's
// warnings and failures, then a summary, then one line per failed node for scripts:
// "doctor: failed node=NAME node-checks=gpu,libfabric software-checks=nccl" with "-" for an
// empty list; NAME is SLURMD_NODENAME under Slurm, else the host name); the others return "".
// `failed` is true on every rank when any node failed a check.
std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed);

}  // namespace jumbo
