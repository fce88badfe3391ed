// NCCL's own log read back through the path a CUDA run takes (comm/nccl_log.h), with the NCCL
// this CUDA build links. Without a GPU, ncclGetUniqueId still starts NCCL's logger: the file
// NCCL writes must be the one capture_nccl_log names (NCCL_DEBUG_FILE's %h and %p expanded as
// NCCL does) and its lines must parse as this process's. With a GPU, a one-rank NCCL
// communicator prints its "Using network" line, which check_nccl_network must find.
// NCCL reads NCCL_DEBUG* once per process: ctest runs each test in a process of its own.
#include <gtest/gtest.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gpu_test_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/comm/nccl_log.h"

namespace jumbo::gputest {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string nccl_host() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  const std::string h = buf;
  return h.substr(0, h.find('.'));
}

const NcclLogSetup& arrange() {
  for (const char* v : {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}) unsetenv(v);
  const std::string dir = (std::filesystem::temp_directory_path() / "jumbo-gpu-test-nccl-logs").string();
  std::filesystem::create_directories(dir);
  setenv("JUMBO_NCCL_LOG_DIR", dir.c_str(), 1);
  return capture_nccl_log(0);
}

TEST(NcclLogReal, NcclWritesTheFileJumboNames) {
  const NcclLogSetup& s = arrange();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);  // NCCL's first call: its logger starts here
  ASSERT_TRUE(std::filesystem::exists(s.path)) << "NCCL (" << ncclGetErrorString(r) << ") wrote no " << s.path;
  const std::string text = read_text(s.path);
  const NcclNetReport rep = parse_nccl_log(text, static_cast<int>(getpid()));
  EXPECT_GE(rep.info_lines + rep.warn_lines, 1) << text;
  EXPECT_EQ(rep.host, nccl_host()) << text;
}

TEST(NcclLogReal, OneRankCommunicatorNamesItsNetwork) {
  JUMBO_REQUIRE_GPU();
  const NcclLogSetup& s = arrange();
  auto backend = make_cuda_backend(0);
  std::shared_ptr<Comm> world = make_nccl_comm(make_solo_comm("world"), backend->stream());
  const NcclNetCensus any = check_nccl_network(*world, ExpectNetwork::any);
  EXPECT_EQ(any.refusal, "");
  EXPECT_NE(any.line.find("NCCL network on 1 ranks: 1 "), std::string::npos) << any.line;
  const NcclNetReport rep = parse_nccl_log(read_text(s.path), static_cast<int>(getpid()));
  ASSERT_FALSE(rep.networks.empty()) << read_text(s.path);
  // A GPU machine without aws-ofi-nccl's EFA is refused by expect_network = efa, by name.
  if (rep.transport != NetTransport::efa && rep.transport != NetTransport::unknown) {
    const NcclNetCensus efa = check_nccl_network(*world, ExpectNetwork::efa);
    EXPECT_NE(efa.refusal.find("comm.expect_network = efa, but NCCL chose " +
                               std::string(to_string(rep.transport)) + " on 1 of 1 ranks: " + rep.host),
              std::string::npos)
        << efa.refusal;
  }
}

}  // namespace
}  // namespace jumbo::gputest
