// NCCL's network on every rank, decided over real MPI ranks (mpirun -np 1, 3 and 8): the path
// a CUDA run takes after its NCCL communicators exist (train/trainer.cpp), with each rank's
// NCCL_DEBUG_FILE written from tests/comm/nccl_logs instead of by NCCL, which needs GPUs.
// capture_nccl_log arranges the file as for NCCL; check_nccl_network reads this process's
// lines from it, gathers and decides. The ranks run on one machine: the host names come
// from the log lines, as they do on a cluster.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "jumbo/comm/comm.h"
#include "jumbo/comm/nccl_log.h"

namespace jumbo {
namespace {

// One log of tests/comm/nccl_logs as this process's NCCL would have written it: its pid in
// every line, the host named `host`.
std::string as_this_process(const std::string& name, const std::string& host) {
  std::ifstream in(std::string(JUMBO_SOURCE_DIR) + "/tests/comm/nccl_logs/" + name);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str(), out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(" NCCL ");
    const size_t colon = line.find(':');
    if (at != std::string::npos && colon < at) {
      const size_t start = line[0] == '[' ? line.find("] ") + 2 : 0;
      const size_t pid_end = line.find(':', colon + 1);
      line = line.substr(0, start) + host + ":" + std::to_string(getpid()) + line.substr(pid_end);
    }
    out += line + "\n";
  }
  return out;
}

const NcclLogSetup& arrange_once() {
  auto w = mpi_world();
  const std::string dir = std::string(JUMBO_BINARY_DIR) + "/tests/comm_mpi_nccl_logs";
  if (w->rank() == 0) std::filesystem::create_directories(dir);
  w->barrier();
  for (const char* v : {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}) unsetenv(v);
  setenv("JUMBO_NCCL_LOG_DIR", dir.c_str(), 1);
  return capture_nccl_log(w->rank());
}

void write_log(const std::string& text) {
  std::ofstream(nccl_log_setup().path) << text;
}

// Rank r on host "p4d-st-<r/2 + 1>": two ranks per host.
std::string host_of(int rank) { return "p4d-st-" + std::to_string(rank / 2 + 1); }

TEST(NcclNetwork, EveryRankOnEfaTrains) {
  auto w = mpi_world();
  const NcclLogSetup& s = arrange_once();
  EXPECT_EQ(std::string(std::getenv("NCCL_DEBUG_FILE")).find("jumbo-nccl.rank" + std::to_string(w->rank())),
            std::string(std::getenv("NCCL_DEBUG_FILE")).rfind('/') + 1);
  write_log(as_this_process(w->rank() % 2 ? "efa_nccl2.23_ofi1.14.log" : "efa_nccl2.18_ofi1.7.log",
                            host_of(w->rank())));
  const NcclNetCensus c = check_nccl_network(*w, ExpectNetwork::efa);
  EXPECT_EQ(c.refusal, "");
  if (w->rank() == 0) {
    const std::string n = std::to_string(w->size());
    EXPECT_EQ(c.line.rfind("NCCL network on " + n + " ranks: " + n + " efa; rank 0: efa (AWS Libfabric, provider "
                           "efa, 4 nics, aws-ofi-nccl 1.7.4-aws); its NCCL log p4d-st-1:", 0),
              0u)
        << c.line;
    EXPECT_NE(c.line.find("its NCCL log p4d-st-1:" + s.path), std::string::npos) << c.line;
    EXPECT_EQ(c.line.find("not efa"), std::string::npos) << c.line;
  } else {
    EXPECT_EQ(c.line, "");
  }
}

TEST(NcclNetwork, OneHostOnSocketsIsRefusedByNameOnEveryRank) {
  auto w = mpi_world();
  const NcclLogSetup& s = arrange_once();
  const int last = w->size() - 1;  // with one rank, rank 0 is the host that fell back
  write_log(as_this_process(w->rank() == last ? "socket_nccl2.23_no_plugin.log" : "efa_nccl2.23_ofi1.14.log",
                            host_of(w->rank())));
  const NcclNetCensus efa = check_nccl_network(*w, ExpectNetwork::efa);
  const std::string path_last = std::string(std::getenv("JUMBO_NCCL_LOG_DIR")) + "/jumbo-nccl.rank" +
                                std::to_string(last) + ".";
  EXPECT_EQ(efa.refusal.rfind("comm.expect_network = efa, but NCCL chose socket on 1 of " +
                                  std::to_string(w->size()) + " ranks: " + host_of(last) + " (rank " +
                                  std::to_string(last) + ": socket (Socket; NET/Plugin: Could not find: "
                                  "libnccl-net.so. Using internal network plugin.; NET/IB : No device found.); "
                                  "NCCL's log " + host_of(last) + ":" + path_last,
                              0),
            0u)
      << efa.refusal;
  EXPECT_EQ(efa.refusal.find('\n'), std::string::npos);
  RecordProperty("refusal", efa.refusal);  // --gtest_output=xml shows the lines
  // expect_network = any records it and names the host, and refuses nothing.
  const NcclNetCensus any = check_nccl_network(*w, ExpectNetwork::any);
  EXPECT_EQ(any.refusal, "");
  if (w->rank() == 0 && w->size() > 2) {
    EXPECT_NE(any.line.find("not efa: " + host_of(last) + " (rank " + std::to_string(last)), std::string::npos)
        << any.line;
  }
  (void)s;
}

TEST(NcclNetwork, ALogWithoutInfoLinesIsNotProof) {
  auto w = mpi_world();
  arrange_once();
  write_log(as_this_process(w->rank() == 0 ? "warn_only.log" : "efa_nccl2.30_ofi1.18.log", host_of(w->rank())));
  const NcclNetCensus c = check_nccl_network(*w, ExpectNetwork::efa);
  EXPECT_NE(c.refusal.find("NCCL chose a network its log does not name on 1 of"), std::string::npos) << c.refusal;
  EXPECT_NE(c.refusal.find(host_of(0) + " (rank 0: unknown (no \"Using network\" line"), std::string::npos)
      << c.refusal;
  // The file NCCL was to write is missing: said, and refused as well.
  std::filesystem::remove(nccl_log_setup().path);
  const NcclNetCensus gone = check_nccl_network(*w, ExpectNetwork::efa);
  EXPECT_NE(gone.refusal.find("; no NCCL log at " + std::string(std::getenv("JUMBO_NCCL_LOG_DIR")) + "/jumbo-nccl.rank"),
            std::string::npos)
      << gone.refusal;
}

}  // namespace
}  // namespace jumbo
