// The doctor's node-local machinery: checks in child processes under a timeout (a hang and a
// crash are results naming the check), the per-node report and its file, and the tables read
// from NCCL's and AWS's sources (the plugin versions NCCL loads, EFA devices per instance).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "jumbo/config/config.h"
#include "jumbo/obs/doctor.h"

namespace {

using jumbo::DoctorCheck;
using Status = DoctorCheck::Status;
using Fault = DoctorCheck::Fault;
namespace fs = std::filesystem;

std::vector<DoctorCheck> one(std::string name, Status status, std::string detail) {
  return {DoctorCheck{std::move(name), status, std::move(detail), Fault::node}};
}

fs::path temp_dir(const std::string& tag) {
  fs::path dir = fs::temp_directory_path() / ("jumbo-doctor-test-" + tag + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(DoctorIsolated, AHangIsAFailedCheckNamingWhereItHung) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<DoctorCheck> got = jumbo::run_isolated_checks(
      {
          {{"gpu"}, Fault::node, "cuInit (the GPU driver)",
           [] {
             std::this_thread::sleep_for(std::chrono::seconds(100));
             return one("gpu", Status::ok, "never");
           }},
          {{"nccl", "nccl-net"}, Fault::software, "loading NCCL",
           [] {
             auto r = one("nccl", Status::ok, "NCCL 2.23.4 with\ta tab");
             r.push_back({"nccl-net", Status::warn, "no plugin", Fault::software});
             return r;
           }},
      },
      0.5);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 5.0) << "the hung child was waited for";
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].name, "gpu");
  EXPECT_EQ(got[0].status, Status::fail);
  EXPECT_EQ(got[0].fault, Fault::node);
  EXPECT_EQ(got[0].detail, "hung after 0.5 s in cuInit (the GPU driver) (killed)");
  EXPECT_EQ(got[1].name, "nccl");
  EXPECT_EQ(got[1].status, Status::ok);
  EXPECT_EQ(got[1].detail, "NCCL 2.23.4 with a tab");
  EXPECT_EQ(got[2].name, "nccl-net");
  EXPECT_EQ(got[2].status, Status::warn);
  EXPECT_EQ(got[2].fault, Fault::software);
}

TEST(DoctorIsolated, ACrashIsAFailedCheck) {
  const std::vector<DoctorCheck> got = jumbo::run_isolated_checks(
      {{{"libfabric"}, Fault::node, "fi_getinfo",
        [] {
          raise(SIGSEGV);
          return one("libfabric", Status::ok, "never");
        }}},
      10);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, Status::fail);
  EXPECT_EQ(got[0].detail.rfind("ended by signal 11 (", 0), 0u) << got[0].detail;
  EXPECT_NE(got[0].detail.find("in fi_getinfo"), std::string::npos) << got[0].detail;
}

TEST(DoctorReport, FailedNodeLineSplitsNodeAndSoftwareFaults) {
  std::vector<DoctorCheck> checks = {
      {"node", Status::ok, "host2: 4 CPUs", Fault::node},
      {"libfabric", Status::fail, "hung after 5 s in fi_getinfo (killed)", Fault::node},
      {"gpu", Status::fail, "no NVIDIA driver", Fault::node},
      {"nccl", Status::fail, "libnccl.so.2 not found", Fault::software},
      {"storage", Status::warn, "slow", Fault::software},
  };
  EXPECT_EQ(jumbo::failed_node_line(checks, "host2"),
            "doctor: failed node=host2 node-checks=libfabric,gpu software-checks=nccl");
  const std::string report = jumbo::local_report(checks, "host2");
  EXPECT_NE(report.find("FAIL  libfabric  hung after 5 s in fi_getinfo (killed)\n"), std::string::npos);
  EXPECT_EQ(report.substr(report.rfind('\n', report.size() - 2) + 1),
            "doctor: failed node=host2 node-checks=libfabric,gpu software-checks=nccl\n");
  checks.resize(1);
  EXPECT_EQ(jumbo::failed_node_line(checks, "host2"), "");
  EXPECT_EQ(jumbo::local_report(checks, "host2"), "ok    node       host2: 4 CPUs\ndoctor: passed node=host2\n");
}

TEST(DoctorReport, WritesTheNodeFileWholeOrThrowsNamingIt) {
  const fs::path dir = temp_dir("report");
  jumbo::write_local_report(dir.string(), "host3", "doctor: passed node=host3\n");
  std::ifstream in(dir / "host3.txt");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "doctor: passed node=host3\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "a temporary file left";
  const std::string missing = (dir / "no-such-dir").string();
  try {
    jumbo::write_local_report(missing, "host3", "x\n");
    FAIL() << "no error for a missing directory";
  } catch (const jumbo::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(missing + "/host3.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(DoctorTables, NetPluginVersionsNcclLoads) {
  // NVIDIA/nccl src/net.cc (up to 2.25) and src/plugin/net.cc (2.26 on), per release tag.
  EXPECT_EQ(jumbo::nccl_net_plugin_range(21805).newest, 6);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(21903).newest, 7);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22304).oldest, 5);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22304).newest, 8);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22403).newest, 9);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22605).oldest, 6);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22707).newest, 10);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(22809).newest, 11);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(23007).newest, 12);
  EXPECT_EQ(jumbo::nccl_net_plugin_range(0).oldest, 6);  // unknown: the newest NCCL's
  EXPECT_EQ(jumbo::nccl_net_plugin_range(0).newest, 12);
}

TEST(DoctorTables, EfaDevicesPerInstanceType) {
  EXPECT_EQ(jumbo::efa_devices_expected("p4d.24xlarge"), 4);
  EXPECT_EQ(jumbo::efa_devices_expected("p5.48xlarge"), 32);
  EXPECT_EQ(jumbo::efa_devices_expected("c5.large"), 0);
}

TEST(DoctorTables, CountsRdmaDevicesBoundToEfa) {
  // The layout of /sys/class/infiniband: NAME/device/driver -> .../drivers/DRIVER.
  const fs::path root = temp_dir("sysfs");
  const fs::path drivers = root / "bus" / "drivers";
  fs::create_directories(drivers / "efa");
  fs::create_directories(drivers / "mlx5_core");
  const auto device = [&](const std::string& name, const std::string& driver) {
    fs::create_directories(root / "class" / name / "device");
    fs::create_directory_symlink(drivers / driver, root / "class" / name / "device" / "driver");
  };
  device("rdmap16s27", "efa");
  device("rdmap32s27", "efa");
  device("mlx5_0", "mlx5_core");
  fs::create_directories(root / "class" / "unbound" / "device");
  EXPECT_EQ(jumbo::count_efa_devices((root / "class").string()), 2);
  EXPECT_EQ(jumbo::count_efa_devices((root / "absent").string()), 0);
  fs::remove_all(root);
}

}  // namespace
