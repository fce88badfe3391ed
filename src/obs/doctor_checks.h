#pragma once
// The node-local checks of `jumbo doctor` (src/obs/doctor_checks.cpp), each one a plain
// function of this process: src/obs/doctor.cpp runs the ones that can hang in child
// processes with a timeout.
#include <string>

#include "jumbo/obs/doctor.h"

namespace jumbo::doctor {

DoctorCheck make_check(std::string name, DoctorCheck::Status status, std::string detail,
                       DoctorCheck::Fault fault = DoctorCheck::Fault::node);
DoctorCheck check_node();
// fi_getinfo's providers, and with expect_efa the efa provider and the EFA devices the
// instance type has (instance_type "" = DMI's product name).
DoctorCheck check_libfabric(bool expect_efa, const std::string& instance_type);
DoctorCheck check_gpus(int expect);

struct NcclLibrary {
  int version = 0;  // 22304 for 2.23.4; 0 when libnccl.so.2 does not load
  std::string text;
};
DoctorCheck check_nccl(bool expect_gpus, NcclLibrary& out);
DoctorCheck check_nccl_net(bool expect_efa, bool expect_gpus, const NcclLibrary& nccl);
DoctorCheck check_build(bool cuda_built, int expect_gpus);
DoctorCheck check_storage(const std::string& dir);
// `dcgmi diag -r 1` where dcgmi is installed (skip where not); needs GPUs to mean anything.
DoctorCheck check_dcgm(int expect_gpus);

}  // namespace jumbo::doctor
