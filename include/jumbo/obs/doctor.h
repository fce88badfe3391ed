#pragma once
// `jumbo doctor`: checks a node can run a training job before GPU hours are spent on it:
// MPI, libfabric providers (is EFA there?), GPUs, NCCL and its network plugin, the shared
// file system, the clock. Run one rank per node; rank 0 prints.
#include <string>
#include <vector>

#include "jumbo/comm/comm.h"

namespace jumbo {

struct DoctorCheck {
  enum class Status { ok, warn, fail, skip };
  std::string name;    // "mpi", "libfabric", "gpu", "nccl", "storage", "clock", "node"
  Status status = Status::ok;
  std::string detail;  // one line
};

struct DoctorOptions {
  bool expect_efa = false;   // the efa provider and NCCL's OFI plugin are required
  int expect_gpus = 0;       // this many GPUs per node are required; 0 = report only
  std::string dir;           // a directory on the shared file system to write; "" = skip
  double max_clock_skew_s = 1.0;  // between ranks, above which the clock check fails
};

// This node's checks. Collective over `world` (the clock check compares the ranks).
std::vector<DoctorCheck> run_node_checks(const DoctorOptions& options, Comm& world);
// "ok    libfabric  ..." (status, name, detail), no host.
std::string format_check(const DoctorCheck& check);
// Collective: rank 0 returns the report (its node's lines, then every other node's
// warnings and failures, then a summary); the others return "". `failed` is true on every
// rank when any node failed a check.
std::string gather_doctor_report(const std::vector<DoctorCheck>& mine, Comm& world, bool* failed);

}  // namespace jumbo
