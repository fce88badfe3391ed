// The NCCL log parser on the lines NCCL and aws-ofi-nccl print (tests/comm/nccl_logs/README.md
// says which versions and where each line comes from), the NCCL_DEBUG* settings jumbo makes
// or keeps, and [comm] expect_network in the run config.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "jumbo/comm/nccl_log.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

std::string log_text(const std::string& name) {
  std::ifstream in(std::string(JUMBO_SOURCE_DIR) + "/tests/comm/nccl_logs/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

NcclNetReport parse(const std::string& name, int pid = 0) { return parse_nccl_log(log_text(name), pid); }

TEST(NcclLog, Nccl218WithAwsOfiNccl17IsEfa) {
  const NcclNetReport r = parse("efa_nccl2.18_ofi1.7.log");
  EXPECT_EQ(r.transport, NetTransport::efa);
  EXPECT_EQ(r.host, "p4d-st-1");
  EXPECT_EQ(r.networks, std::vector<std::string>{"AWS Libfabric"});
  EXPECT_EQ(r.provider, "efa");
  EXPECT_EQ(r.nics, 4);
  EXPECT_EQ(r.plugin, "aws-ofi-nccl 1.7.4-aws");
  EXPECT_TRUE(r.notes.empty()) << r.notes.front();  // no CollNet in aws-ofi-nccl is normal
  EXPECT_TRUE(meets(r.transport, ExpectNetwork::efa));
  EXPECT_EQ(describe(r), "efa (AWS Libfabric, provider efa, 4 nics, aws-ofi-nccl 1.7.4-aws)");
}

TEST(NcclLog, Nccl223And230WithNewProviderLineAreEfa) {
  const NcclNetReport a = parse("efa_nccl2.23_ofi1.14.log");
  EXPECT_EQ(a.transport, NetTransport::efa);
  EXPECT_EQ(a.networks, std::vector<std::string>{"Libfabric"});
  EXPECT_EQ(a.nics, 4);
  EXPECT_EQ(a.plugin, "aws-ofi-nccl 1.14.0");
  const NcclNetReport b = parse("efa_nccl2.30_ofi1.18.log");
  EXPECT_EQ(b.transport, NetTransport::efa);
  EXPECT_EQ(b.host, "p5-st-1");
  EXPECT_EQ(b.nics, 32);
  EXPECT_TRUE(b.notes.empty());
}

TEST(NcclLog, SocketFallbackOfEachVersionSaysWhy) {
  const NcclNetReport a = parse("socket_nccl2.18_no_plugin.log");
  EXPECT_EQ(a.transport, NetTransport::socket);
  EXPECT_EQ(a.host, "p4d-st-3");
  ASSERT_EQ(a.notes.size(), 3u);
  EXPECT_EQ(a.notes[0], "NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open "
                        "shared object file: No such file or directory");
  EXPECT_EQ(a.notes[2], "NET/IB : No device found.");
  EXPECT_FALSE(meets(a.transport, ExpectNetwork::efa));
  EXPECT_TRUE(meets(a.transport, ExpectNetwork::socket));

  const NcclNetReport b = parse("socket_nccl2.23_no_plugin.log");
  EXPECT_EQ(b.transport, NetTransport::socket);
  ASSERT_FALSE(b.notes.empty());
  EXPECT_EQ(b.notes[0], "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.");
  EXPECT_EQ(describe(b), "socket (Socket; NET/Plugin: Could not find: libnccl-net.so. Using internal network "
                         "plugin.; NET/IB : No device found.)");

  // 2.30: a plugin that is there but does not load; the first line has a timestamp.
  const NcclNetReport c = parse("socket_nccl2.30_plugin_broken.log");
  EXPECT_EQ(c.transport, NetTransport::socket);
  EXPECT_EQ(c.host, "p4d-st-5");
  ASSERT_EQ(c.notes.size(), 3u);
  EXPECT_EQ(c.notes[0], "NET/Plugin: libnccl-net.so: /opt/amazon/ofi-nccl/lib/libnccl-net.so: undefined "
                        "symbol: fi_getinfo");
  EXPECT_EQ(c.notes[2], "Failed to initialize NET plugin IB");
}

TEST(NcclLog, OtherProvidersAndInfiniBand) {
  const NcclNetReport tcp = parse("tcp_ofi1.14.log");
  EXPECT_EQ(tcp.transport, NetTransport::ofi_other);
  EXPECT_EQ(tcp.provider, "tcp");
  EXPECT_FALSE(meets(tcp.transport, ExpectNetwork::efa));
  const NcclNetReport ib = parse("ib_nccl2.18.log");
  EXPECT_EQ(ib.transport, NetTransport::ib);
  EXPECT_TRUE(meets(ib.transport, ExpectNetwork::ib));
  EXPECT_FALSE(meets(ib.transport, ExpectNetwork::efa));
  EXPECT_EQ(describe(ib), "ib (IB)");  // the plugin's absence is normal on IB: not repeated
}

TEST(NcclLog, WarnOnlyLogProvesNothing) {
  const NcclNetReport r = parse("warn_only.log");
  EXPECT_EQ(r.transport, NetTransport::unknown);
  EXPECT_EQ(r.info_lines, 0);
  EXPECT_EQ(r.warn_lines, 1);
  EXPECT_EQ(r.host, "p4d-st-6");
  EXPECT_EQ(describe(r), "unknown (no \"Using network\" line among 0 NCCL INFO lines; 1 WARN lines, the first: "
                         "NET/OFI Unable to register memory (type: 2) for buffer 0x7f3c2a000000)");
  EXPECT_FALSE(meets(r.transport, ExpectNetwork::efa));
  EXPECT_TRUE(meets(r.transport, ExpectNetwork::any));
}

TEST(NcclLog, SharedFileIsReadPerProcess) {
  EXPECT_EQ(parse("shared_file.log", 44441).transport, NetTransport::efa);
  EXPECT_EQ(parse("shared_file.log", 44442).transport, NetTransport::socket);
  // Both processes' lines at once: the weaker network counts.
  const NcclNetReport both = parse("shared_file.log");
  EXPECT_EQ(both.transport, NetTransport::socket);
  EXPECT_EQ(both.networks, (std::vector<std::string>{"Socket", "Libfabric"}));
}

TEST(NcclLog, PluginOfAnOlderInterfaceIsNoFailure) {
  // NCCL 2.23 looks for ncclNetPlugin_v8 first (src/net.cc, ncclNetPluginLoad), then loads v7.
  const std::string text =
      "h:1:1 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.\n"
      "h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v7)\n"
      "h:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)\n"
      "h:1:2 [0] NCCL INFO Using network Libfabric\r\n";
  const NcclNetReport r = parse_nccl_log(text);
  EXPECT_EQ(r.transport, NetTransport::efa);
  EXPECT_TRUE(r.notes.empty());
}

TEST(NcclLog, DebugFileExpandsAsNcclDoes) {
  EXPECT_EQ(expand_nccl_debug_file("/fsx/logs/nccl.%h.%p.log", "p4d-st-1.ec2.internal", 42),
            "/fsx/logs/nccl.p4d-st-1.42.log");
  EXPECT_EQ(expand_nccl_debug_file("a%%b%x%h", "we/ird%host", 7), "a%b%xwe-ird-host");
}

// The NCCL_DEBUG* settings: made when unset, kept (and said) when the user set them.
class NcclLogSettings : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
    setenv("JUMBO_NCCL_LOG_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
    unsetenv("JUMBO_NCCL_LOG_DIR");
  }
  static constexpr const char* kVars[] = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"};
  std::string dir_ = std::string(JUMBO_BINARY_DIR) + "/tests/comm_nccl_logs";
};

TEST_F(NcclLogSettings, UnsetVariablesAreSetToAFilePerRank) {
  const NcclLogSetup s = arrange_nccl_log(7);
  EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "INFO");
  EXPECT_STREQ(std::getenv("NCCL_DEBUG_SUBSYS"), "INIT,NET");
  EXPECT_EQ(std::string(std::getenv("NCCL_DEBUG_FILE")), dir_ + "/jumbo-nccl.rank7.%h.%p.log");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(s.path, expand_nccl_debug_file(dir_ + "/jumbo-nccl.rank7.%h.%p.log", host, getpid()));
  EXPECT_TRUE(s.can_prove);
  EXPECT_EQ(s.kept, "");
}

TEST_F(NcclLogSettings, UserSettingsAreKeptAndAWarnLevelSaysItCannotProve) {
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", "/fsx/nccl.%h.log", 1);
  const NcclLogSetup s = arrange_nccl_log(0);
  EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "WARN");
  EXPECT_STREQ(std::getenv("NCCL_DEBUG_FILE"), "/fsx/nccl.%h.log");
  EXPECT_STREQ(std::getenv("NCCL_DEBUG_SUBSYS"), "INIT,NET");
  EXPECT_FALSE(s.can_prove);
  EXPECT_EQ(s.kept, "NCCL_DEBUG=WARN (it hides the INFO lines that name the network), "
                    "NCCL_DEBUG_FILE=/fsx/nccl.%h.log (set before jumbo started: kept)");
}

TEST_F(NcclLogSettings, SubsystemsWithoutInitCannotProve) {
  for (const char* subsys : {"COLL,P2P", "^INIT", "^init,NET"}) {
    unsetenv("NCCL_DEBUG_SUBSYS");
    setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
    EXPECT_FALSE(arrange_nccl_log(0).can_prove) << subsys;
  }
  for (const char* subsys : {"INIT", "ALL", "^COLL", "net,init"}) {
    setenv("NCCL_DEBUG_SUBSYS", subsys, 1);
    EXPECT_TRUE(arrange_nccl_log(0).can_prove) << subsys;
  }
}

TEST(CommConfig, ExpectNetworkIsAChoice) {
  const std::string toml =
      "[model]\nlayers = 2\nd_model = 64\nheads = 4\nvocab = 512\ncontext = 32\n"
      "[parallel]\nmicro_batch = 2\n[train]\nsteps = 10\nglobal_batch = 8\n"
      "[data]\ntrain = \"corpus/train\"\ntokenizer = \"corpus/tok.model\"\n";
  EXPECT_EQ(parse_run_config(toml, "run.toml", {}).comm.expect_network, ExpectNetwork::any);
  EXPECT_EQ(parse_run_config(toml + "[comm]\nexpect_network = \"efa\"\n", "run.toml", {}).comm.expect_network,
            ExpectNetwork::efa);
  EXPECT_EQ(parse_run_config(toml, "run.toml", {"comm.expect_network=ib"}).comm.expect_network,
            ExpectNetwork::ib);
  try {
    parse_run_config(toml, "run.toml", {"comm.expect_network=efa0"});
    FAIL() << "accepted efa0";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("comm.expect_network"), std::string::npos) << what;
    EXPECT_NE(what.find("\"any\", \"efa\", \"ib\" or \"socket\""), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_NE(describe(parse_run_config(toml, "run.toml", {"comm.expect_network=efa"})).find(
                "[comm]\nexpect_network = \"efa\"\n"),
            std::string::npos);
}

}  // namespace
}  // namespace jumbo
