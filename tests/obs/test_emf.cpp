// CloudWatch Embedded Metric Format: the line format, and EmfLog to a file, TCP and UDP, and
// to an agent that is absent or stuck (which must never throw or stall training).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"
#include "jumbo/obs/emf.h"
#include "jumbo/obs/metrics.h"
#include "obs_test_support.h"

namespace fs = std::filesystem;
using jumbo::StepMetrics;
using nlohmann::json;

namespace {

using jumbo::testing::sample_metrics;


const std::set<std::string> kCloudWatchUnits = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
    "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count",
    "Bytes/Second", "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second",
    "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second", "Gigabits/Second",
    "Terabits/Second", "Count/Second", "None"};

// Checks the EMF structure of one line; returns the declared metric names in order.
std::vector<std::string> check_emf(const json& j) {
  std::vector<std::string> names;
  EXPECT_TRUE(j.is_object());
  EXPECT_TRUE(j["_aws"]["Timestamp"].is_number_integer());
  const json& directives = j["_aws"]["CloudWatchMetrics"];
  EXPECT_TRUE(directives.is_array());
  EXPECT_EQ(directives.size(), 1u);
  const json& d = directives[0];
  EXPECT_EQ(d["Namespace"], "test-ns");
  EXPECT_EQ(d["Dimensions"], json::parse(R"([["RunName","Layout"]])"));
  for (const auto& dimension : d["Dimensions"][0]) {
    EXPECT_TRUE(j[dimension.get<std::string>()].is_string()) << dimension;
  }
  EXPECT_LE(d["Metrics"].size(), 100u);
  for (const auto& metric : d["Metrics"]) {
    const std::string name = metric["Name"].get<std::string>();
    names.push_back(name);
    EXPECT_TRUE(kCloudWatchUnits.count(metric["Unit"].get<std::string>())) << metric;
    EXPECT_TRUE(j.contains(name)) << name;
    EXPECT_TRUE(j[name].is_number()) << name;
    if (j[name].is_number_float()) {
      EXPECT_TRUE(std::isfinite(j[name].get<double>())) << name;
    }
  }
  return names;
}

std::string line_of(const StepMetrics& m) {
  return jumbo::emf_line(m, "test-ns", "run-a", "tp2-pp2-dp1", 1700000000123);
}

}  // namespace

TEST(EmfLine, EveryMetricDeclaredWithItsUnitAndValue) {
  const std::string line = line_of(sample_metrics());
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one object per line";
  const json j = json::parse(line);
  const auto names = check_emf(j);
  EXPECT_EQ(names, (std::vector<std::string>{"Loss", "TokensPerSecond", "TFLOPsPerDevice", "MFU",
                                             "GradNorm", "StepTime", "LearningRate", "MemoryPeak",
                                             "Anomalies"}));
  EXPECT_EQ(j["_aws"]["Timestamp"].get<int64_t>(), 1700000000123);
  EXPECT_EQ(j["RunName"], "run-a");
  EXPECT_EQ(j["Layout"], "tp2-pp2-dp1");
  EXPECT_EQ(j["Step"].get<int64_t>(), 12);
  EXPECT_EQ(j["Tokens"].get<int64_t>(), 12 * 32 * 256);
  EXPECT_DOUBLE_EQ(j["Loss"].get<double>(), 5.1234);
  EXPECT_DOUBLE_EQ(j["TokensPerSecond"].get<double>(), 12345.0);
  EXPECT_DOUBLE_EQ(j["TFLOPsPerDevice"].get<double>(), 0.1034);
  EXPECT_DOUBLE_EQ(j["MFU"].get<double>(), 51.2);  // percent
  EXPECT_DOUBLE_EQ(j["GradNorm"].get<double>(), 0.85);
  EXPECT_DOUBLE_EQ(j["StepTime"].get<double>(), 0.6636);
  EXPECT_DOUBLE_EQ(j["LearningRate"].get<double>(), 3e-4);
  EXPECT_EQ(j["MemoryPeak"].get<uint64_t>(), uint64_t(1288490189));
  const json& metrics = j["_aws"]["CloudWatchMetrics"][0]["Metrics"];
  std::map<std::string, std::string> units;
  for (const auto& m : metrics) units[m["Name"]] = m["Unit"];
  EXPECT_EQ(units["TokensPerSecond"], "Count/Second");
  EXPECT_EQ(units["MFU"], "Percent");
  EXPECT_EQ(units["StepTime"], "Seconds");
  EXPECT_EQ(units["MemoryPeak"], "Bytes");
  EXPECT_EQ(units["Loss"], "None");
  EXPECT_FALSE(j.contains("ValLoss"));
}

TEST(EmfLine, ValLossOnlyOnLinesThatHaveIt) {
  StepMetrics m = sample_metrics();
  m.val_loss = 5.3;
  const json j = json::parse(line_of(m));
  const auto names = check_emf(j);
  EXPECT_EQ(std::count(names.begin(), names.end(), "ValLoss"), 1);
  EXPECT_DOUBLE_EQ(j["ValLoss"].get<double>(), 5.3);
}

TEST(EmfLine, NonFiniteMetricsAreLeftOutOfDeclarationAndValues) {
  StepMetrics m = sample_metrics();
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.val_loss = -std::numeric_limits<double>::infinity();
  const std::string line = line_of(m);
  const json j = json::parse(line);  // strict: NaN would not parse
  const auto names = check_emf(j);
  for (const char* gone : {"Loss", "GradNorm", "ValLoss"}) {
    EXPECT_FALSE(j.contains(gone)) << gone;
    EXPECT_EQ(std::count(names.begin(), names.end(), gone), 0) << gone;
  }
  EXPECT_EQ(names.size(), 7u);
  EXPECT_DOUBLE_EQ(j["LearningRate"].get<double>(), 3e-4);
}

TEST(EmfLine, AnomaliesAndStragglersAreMetricsAnAlarmCanUse) {
  StepMetrics m = sample_metrics();
  EXPECT_EQ(json::parse(line_of(m))["Anomalies"].get<double>(), 0);  // zeros are data points
  m.anomaly = jumbo::StepAnomaly{};
  jumbo::RankTimes t;
  t.slowest_ratio = 3.5;
  t.stragglers.push_back({.rank = 7, .host = "node-b", .ratio = 3.5, .intervals = 2});
  m.ranks = t;
  const json j = json::parse(line_of(m));
  const auto names = check_emf(j);
  for (const char* name : {"Anomalies", "StragglerRatio", "Stragglers"})
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name;
  EXPECT_EQ(j["Anomalies"].get<double>(), 1);
  EXPECT_EQ(j["StragglerRatio"].get<double>(), 3.5);
  EXPECT_EQ(j["Stragglers"].get<double>(), 1);
}

TEST(EmfNames, LayoutAndRunName) {
  EXPECT_EQ(jumbo::emf_layout(2, 4, 8), "tp2-pp4-dp8");
  jumbo::RunConfig cfg;
  cfg.source = "inputs/runs/j1-jumbo.toml";
  EXPECT_EQ(jumbo::emf_run_name(cfg), "j1-jumbo");
  cfg.source = "<embedded demo>";
  EXPECT_EQ(jumbo::emf_run_name(cfg), "embedded-demo");
  cfg.log.run_name = "sweep lr=1e-4";
  EXPECT_EQ(jumbo::emf_run_name(cfg), "sweep lr=1e-4");
}

namespace {

class EmfScratch : public jumbo::testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    log_.emf_namespace = "test-ns";
  }
  void TearDown() override {
    ScratchDirTest::TearDown();
    for (int fd : fds_) close(fd);
  }
  // A socket on 127.0.0.1 with an ephemeral port; `listening` only for TCP.
  int bound_socket(int type, bool listening, int* port) {
    const int fd = socket(AF_INET, type, 0);
    EXPECT_GE(fd, 0);
    fds_.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    if (listening) {
      EXPECT_EQ(listen(fd, 4), 0);
    }
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    *port = ntohs(a.sin_port);
    return fd;
  }
  // Reads from `fd` until `lines` newlines arrived, 5 s passed, or nothing came for 0.5 s
  // after something had.
  static std::string read_lines(int fd, size_t lines) {
    std::string got;
    size_t newlines = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (newlines < lines && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      const int ready = poll(&p, 1, got.empty() ? 100 : 500);
      if (ready <= 0 && !got.empty()) break;
      if (ready <= 0) continue;
      char buf[65536];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
      newlines += static_cast<size_t>(std::count(buf, buf + n, '\n'));
    }
    return got;
  }
  static std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(text.substr(start, nl - start));
    }
    return lines;
  }
  jumbo::LogConfig log_;
  std::vector<int> fds_;
};

}  // namespace

TEST_F(EmfScratch, FileGetsOneFlushedLinePerWriteAndAppends) {
  log_.emf_file = (dir_ / "nested" / "emf.log").string();
  {
    jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
    StepMetrics m = sample_metrics();
    emf.write(m);
    m.step = 13;
    m.val_loss = 5.0;
    emf.write(m);
    std::ifstream in(log_.emf_file);  // readable before close: flushed per line
    std::string a, b, c;
    ASSERT_TRUE(std::getline(in, a) && std::getline(in, b));
    EXPECT_FALSE(std::getline(in, c));
    const json first = json::parse(a), second = json::parse(b);
    check_emf(first);
    check_emf(second);
    EXPECT_EQ(first["Step"], 12);
    EXPECT_EQ(second["Step"], 13);
    EXPECT_TRUE(second.contains("ValLoss"));
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
    EXPECT_NEAR(static_cast<double>(first["_aws"]["Timestamp"].get<int64_t>()),
                static_cast<double>(now_ms), 60000.0);
  }
  jumbo::EmfLog again(log_, "run-a", "tp1-pp1-dp1");  // a resumed run appends
  again.write(sample_metrics());
  std::ifstream in(log_.emf_file);
  int lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  EXPECT_EQ(lines, 3);
}

TEST_F(EmfScratch, UnopenableFileIsAUserErrorNamingKeyAndPath) {
  fs::create_directories(dir_ / "is-a-directory");
  log_.emf_file = (dir_ / "is-a-directory").string();
  try {
    jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
    FAIL() << "expected UserError";
  } catch (const jumbo::UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("log.emf_file = " + log_.emf_file), std::string::npos) << what;
    EXPECT_NE(what.find("cannot open for writing"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}

TEST_F(EmfScratch, BlankRunNameIsAUserError) {
  log_.emf_file = (dir_ / "emf.log").string();
  EXPECT_THROW(jumbo::EmfLog(log_, "  ", "tp1-pp1-dp1"), jumbo::UserError);
  EXPECT_THROW(jumbo::EmfLog(log_, "caf\xc3\xa9", "tp1-pp1-dp1"), jumbo::UserError);
}

TEST_F(EmfScratch, MalformedAddressIsAUserErrorNotACrash) {
  for (const char* address : {"127.0.0.1:25888", "http://127.0.0.1:25888", "tcp://"}) {
    log_.emf_address = address;
    EXPECT_THROW(jumbo::EmfLog(log_, "run-a", "tp1-pp1-dp1"), jumbo::UserError) << address;
  }
}

TEST_F(EmfScratch, TcpAgentReceivesEveryLine) {
  int port = 0;
  const int listener = bound_socket(SOCK_STREAM, true, &port);
  log_.emf_address = "tcp://127.0.0.1:" + std::to_string(port);
  jumbo::EmfLog emf(log_, "run-a", "tp2-pp2-dp1");
  StepMetrics m = sample_metrics();
  for (int i = 0; i < 3; ++i) {
    m.step = 100 + i;
    emf.write(m);
  }
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  fds_.push_back(conn);
  const auto lines = split_lines(read_lines(conn, 3));
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const json j = json::parse(lines[i]);
    check_emf(j);
    EXPECT_EQ(j["Step"], 100 + i);
    EXPECT_EQ(j["Layout"], "tp2-pp2-dp1");
  }
  EXPECT_EQ(emf.dropped(), 0);
}

TEST_F(EmfScratch, UdpAgentReceivesOneDatagramPerLine) {
  int port = 0;
  const int receiver = bound_socket(SOCK_DGRAM, false, &port);
  log_.emf_address = "udp://127.0.0.1:" + std::to_string(port);
  jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
  StepMetrics m = sample_metrics();
  m.val_loss = 4.5;
  emf.write(m);
  m.step = 13;
  m.val_loss.reset();
  emf.write(m);
  for (int expected_step : {12, 13}) {
    const std::string datagram = read_lines(receiver, 1);
    ASSERT_FALSE(datagram.empty());
    EXPECT_EQ(datagram.back(), '\n');
    const json j = json::parse(datagram);
    check_emf(j);
    EXPECT_EQ(j["Step"], expected_step);
    EXPECT_EQ(j.contains("ValLoss"), expected_step == 12);
  }
}

TEST_F(EmfScratch, ClosedPortNeitherThrowsNorBlocksAndWarnsOnce) {
  int port = 0;
  bound_socket(SOCK_STREAM, false, &port);  // bound, not listening: connections are refused
  log_.emf_address = "tcp://127.0.0.1:" + std::to_string(port);
  testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  {
    jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
    for (int i = 0; i < 5; ++i) emf.write(sample_metrics());
    EXPECT_EQ(emf.dropped(), 5);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find(log_.emf_address), std::string::npos) << err;
  EXPECT_NE(err.find("Connection refused"), std::string::npos) << err;
}

TEST_F(EmfScratch, UnreachableHostIsBoundedByTheConnectTimeout) {
  // TEST-NET-1 (RFC 5737) is never routed: either the connect times out or fails at once.
  log_.emf_address = "tcp://192.0.2.1:25888";
  testing::internal::CaptureStderr();
  const auto t0 = std::chrono::steady_clock::now();
  jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
  for (int i = 0; i < 3; ++i) emf.write(sample_metrics());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  testing::internal::GetCapturedStderr();
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(emf.dropped(), 3);
}

TEST_F(EmfScratch, AgentThatHangsUpDoesNotKillTheRun) {
  int port = 0;
  const int listener = bound_socket(SOCK_STREAM, true, &port);
  log_.emf_address = "tcp://127.0.0.1:" + std::to_string(port);
  jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  close(conn);  // the agent goes away: later sends meet EPIPE/ECONNRESET, never SIGPIPE
  testing::internal::CaptureStderr();
  for (int i = 0; i < 5; ++i) {
    emf.write(sample_metrics());
    usleep(20000);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_GE(emf.dropped(), 1);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("send failed"), std::string::npos) << err;
}

TEST_F(EmfScratch, AgentThatStopsReadingCostsDropsNotTimeAndNoTornLines) {
  int port = 0;
  const int listener = bound_socket(SOCK_STREAM, true, &port);
  log_.emf_address = "tcp://127.0.0.1:" + std::to_string(port);
  jumbo::EmfLog emf(log_, "run-a", "tp1-pp1-dp1");
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  fds_.push_back(conn);
  StepMetrics m = sample_metrics();
  const auto t0 = std::chrono::steady_clock::now();
  int written = 0;
  while (emf.dropped() == 0 && written < 200000) {
    m.step = ++written;
    emf.write(m);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(emf.dropped(), 0) << written << " lines all fit";
  EXPECT_LT(seconds, 10.0);
  for (int i = 0; i < 5; ++i) {  // more writes while full: still no blocking
    m.step = ++written;
    emf.write(m);
  }
  // Whatever reached the agent is whole lines, in order.
  const std::string got = read_lines(conn, static_cast<size_t>(written));
  const auto lines = split_lines(got);
  ASSERT_FALSE(lines.empty());
  int64_t previous = 0;
  for (const auto& line : lines) {
    const json j = json::parse(line);
    EXPECT_GT(j["Step"].get<int64_t>(), previous);
    previous = j["Step"].get<int64_t>();
  }
  EXPECT_EQ(static_cast<int64_t>(lines.size()) + emf.dropped(), written - (got.back() == '\n' ? 0 : 1))
      << "every line either arrived or was counted as dropped";
}

namespace {

// Runs tests/obs/validate_emf.py; returns its exit status and puts its output in `out`.
int run_validator(const std::string& args, std::string* out) {
  const std::string cmd = "python3 " + std::string(JUMBO_SOURCE_DIR) +
                          "/tests/obs/validate_emf.py " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_F(EmfScratch, ValidatorAcceptsWhatEmfLogWritesAndRejectsBrokenLines) {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  log_.emf_file = (dir_ / "emf.log").string();
  {
    jumbo::EmfLog emf(log_, "run-a", "tp2-pp1-dp4");
    StepMetrics m = sample_metrics();
    emf.write(m);
    m.val_loss = 5.0;
    emf.write(m);
    m.val_loss.reset();
    m.loss = std::nan("");  // Loss left out of this line
    emf.write(m);
  }
  std::string out;
  EXPECT_EQ(run_validator(log_.emf_file + " --expect-metrics TokensPerSecond,MFU,MemoryPeak", &out), 0)
      << out;
  EXPECT_EQ(out, "3 lines ok\n");
  out.clear();
  EXPECT_EQ(run_validator(log_.emf_file + " --expect-metrics Loss", &out), 1) << out;
  EXPECT_NE(out.find("emf.log:3: expected metric 'Loss' is not declared"), std::string::npos) << out;

  // Each line below breaks one rule; the validator names every one with its line number.
  const std::string good = line_of(sample_metrics());
  std::string bad_unit = good, nan_value = good, seconds = good, missing = good;
  bad_unit.replace(bad_unit.find("Count/Second"), 12, "Tokens/Second");
  nan_value.replace(nan_value.find("\"Loss\":5.1234"), 13, "\"Loss\":NaN");
  seconds.replace(seconds.find("1700000000123"), 13, "1700000000");
  missing.replace(missing.find("\"GradNorm\":0.85,"), 16, "");
  const std::string broken = (dir_ / "broken.log").string();
  std::ofstream(broken) << good << '\n' << bad_unit << '\n' << nan_value << '\n' << seconds << '\n'
                        << missing << '\n' << "{\"_aws\":" << '\n';
  out.clear();
  EXPECT_EQ(run_validator(broken, &out), 1) << out;
  for (const char* expected :
       {"broken.log:2: metric 'TokensPerSecond': unit 'Tokens/Second' is not a CloudWatch unit",
        "broken.log:3: not JSON", "broken.log:4: _aws.Timestamp 1700000000: not milliseconds",
        "broken.log:5: metric 'GradNorm' declared but has no value member", "broken.log:6: not JSON"}) {
    EXPECT_NE(out.find(expected), std::string::npos) << expected << "\n" << out;
  }
  EXPECT_EQ(out.find("broken.log:1:"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 5) << out;
}
