// MetricsLog / to_json_line / human_line / format_duration: what the trainer writes each step.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"
#include "jumbo/obs/metrics.h"
#include "obs_test_support.h"

namespace fs = std::filesystem;
using jumbo::StepMetrics;

namespace {

using jumbo::testing::sample_metrics;

// A fresh directory under the build tree per test, removed afterwards.
class MetricsFile : public jumbo::testing::ScratchDirTest {};

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

TEST(MetricsJson, EveryFieldParsesBackWithItsValue) {
  const StepMetrics m = sample_metrics();
  const std::string line = jumbo::to_json_line(m);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one object per line";
  const auto j = nlohmann::json::parse(line);
  const std::vector<std::string> expected_keys = {
      "step", "total_steps", "loss", "lr", "grad_norm", "global_batch", "tokens", "tokens_per_s",
      "tflops_per_device", "mfu", "step_time_s", "mem_peak_bytes", "eta_s"};
  EXPECT_EQ(j.size(), expected_keys.size());
  for (const auto& key : expected_keys) EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j.contains("val_loss"));
  EXPECT_EQ(j["step"].get<int64_t>(), 12);
  EXPECT_EQ(j["total_steps"].get<int64_t>(), 200);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 5.1234);
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 3e-4);
  EXPECT_DOUBLE_EQ(j["grad_norm"].get<double>(), 0.85);
  EXPECT_EQ(j["global_batch"].get<int64_t>(), 32);
  EXPECT_EQ(j["tokens"].get<int64_t>(), 12 * 32 * 256);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 12345.0);
  EXPECT_DOUBLE_EQ(j["tflops_per_device"].get<double>(), 0.1034);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.512);
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), 0.6636);
  EXPECT_EQ(j["mem_peak_bytes"].get<uint64_t>(), uint64_t(1288490189));
  EXPECT_DOUBLE_EQ(j["eta_s"].get<double>(), 192.0);
}

TEST(MetricsJson, ValLossOnlyWhenPresent) {
  StepMetrics m = sample_metrics();
  m.val_loss = 5.3;
  const auto j = nlohmann::json::parse(jumbo::to_json_line(m));
  ASSERT_TRUE(j.contains("val_loss"));
  EXPECT_DOUBLE_EQ(j["val_loss"].get<double>(), 5.3);
  EXPECT_EQ(j.size(), 14u);
}

TEST(MetricsJson, NonFiniteValuesBecomeNull) {
  StepMetrics m = sample_metrics();
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.val_loss = -std::numeric_limits<double>::infinity();
  const std::string line = jumbo::to_json_line(m);
  EXPECT_EQ(line.find("NaN"), std::string::npos);
  EXPECT_EQ(line.find("nan"), std::string::npos);
  EXPECT_EQ(line.find("inf"), std::string::npos);
  const auto j = nlohmann::json::parse(line);  // strict parser: would throw on NaN
  EXPECT_TRUE(j["loss"].is_null());
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_TRUE(j["val_loss"].is_null());
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 3e-4);  // finite neighbours untouched
}

TEST(MetricsJson, AnomalyAndRankTimesWhenPresent) {
  StepMetrics m = sample_metrics();
  m.anomaly = jumbo::StepAnomaly{
      .record = {.step = 12, .first_sample = 160, .end_sample = 192,
                 .kind = jumbo::AnomalyKind::spike, .action = jumbo::AnomalyAction::rewind,
                 .loss = 9, .rewound_to_step = 10},
      .requested = jumbo::AnomalyAction::rewind, .running_mean = 4, .threshold = 6, .recent = 1,
      .limit = 5, .window = 1000};
  jumbo::RankTimes t;
  t.compute_s = {1, 1.5, 4};
  t.wait_s = {0.1, 2, 3};
  t.slowest_rank = 3;
  t.slowest_host = "node-b";
  t.slowest_ratio = 2.5;
  t.stragglers.push_back({.rank = 3, .host = "node-b", .ratio = 2.5, .intervals = 2});
  m.ranks = t;
  const auto j = nlohmann::json::parse(jumbo::to_json_line(m));
  const auto& a = j["anomaly"];
  EXPECT_EQ(a["kind"], "spike");
  EXPECT_EQ(a["action"], "rewind");
  EXPECT_EQ(a["loss_mean"].get<double>(), 4);
  EXPECT_EQ(a["skipped_samples"], nlohmann::json({160, 192}));
  EXPECT_EQ(a["rewound_to_step"].get<int>(), 10);
  EXPECT_EQ(j["ranks"]["compute_s"]["median"].get<double>(), 1.5);
  EXPECT_EQ(j["ranks"]["stragglers"][0]["host"], "node-b");
  m.loss = 9;
  EXPECT_EQ(jumbo::anomaly_line(m),
            "step 12: loss spike: 9.0000 > 1.5 x running mean 4.0000; rewound to the checkpoint "
            "of step 10 and skipped samples 160-191; anomaly 1 of at most 5 in 1000 steps");
  EXPECT_EQ(jumbo::rank_times_lines(t, 1.25).back(),
            "straggler: rank 3 on host node-b computed 2.50x its stage's median for 2 intervals "
            "in a row (log.straggler_ratio = 1.25)");
}

TEST(MetricsHuman, LineCarriesEveryFigure) {
  StepMetrics m = sample_metrics();
  m.val_loss = 5.3;
  EXPECT_EQ(jumbo::human_line(m),
            "step   12/200 | loss 5.1234 | val 5.3000 | lr 3.00e-04 | gnorm 0.850 | batch 32 | "
            "12.3k tok/s | 0.103 TFLOP/s | MFU 51.2% | mem 1.2 GiB | left 3m12s");
}

TEST(MetricsHuman, NoValWithoutValLoss) {
  const std::string line = jumbo::human_line(sample_metrics());
  EXPECT_EQ(line.find("val"), std::string::npos) << line;
  EXPECT_NE(line.find("| loss 5.1234 | lr 3.00e-04 |"), std::string::npos) << line;
}

TEST(MetricsHuman, SmallMemoryAndRatesStayReadable) {
  StepMetrics m = sample_metrics();
  m.step = 3;
  m.total_steps = 100000;
  m.tokens_per_s = 950;
  m.mem_peak_bytes = 300ull << 20;
  m.eta_s = 3 * 86400 + 4 * 3600 + 59;
  const std::string line = jumbo::human_line(m);
  EXPECT_EQ(line.rfind("step      3/100000 |", 0), 0u) << line;
  EXPECT_NE(line.find("| 950 tok/s |"), std::string::npos) << line;
  EXPECT_NE(line.find("| mem 300 MiB |"), std::string::npos) << line;
  EXPECT_NE(line.find("| left 3d04h"), std::string::npos) << line;
}

TEST(FormatDuration, Cases) {
  EXPECT_EQ(jumbo::format_duration(0), "0s");
  EXPECT_EQ(jumbo::format_duration(45), "45s");
  EXPECT_EQ(jumbo::format_duration(59.4), "59s");
  EXPECT_EQ(jumbo::format_duration(59.6), "1m00s");
  EXPECT_EQ(jumbo::format_duration(192), "3m12s");
  EXPECT_EQ(jumbo::format_duration(2 * 3600 + 5 * 60 + 30), "2h05m");
  EXPECT_EQ(jumbo::format_duration(3 * 86400 + 4 * 3600 + 10 * 60), "3d04h");
  EXPECT_EQ(jumbo::format_duration(-5), "0s");
  EXPECT_EQ(jumbo::format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
}

TEST_F(MetricsFile, FileIsCreatedInANewDirectoryOneFlushedLinePerStep) {
  const fs::path path = dir_ / "nested" / "metrics.jsonl";
  jumbo::MetricsLog log(path.string());
  ASSERT_TRUE(fs::exists(path));
  StepMetrics m = sample_metrics();
  log.write(m);
  // Readable before the log is closed: each line is flushed as it is written.
  auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["step"].get<int64_t>(), 12);
  m.step = 13;
  m.val_loss = 5.25;
  log.write(m);
  lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  const auto second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["step"].get<int64_t>(), 13);
  EXPECT_DOUBLE_EQ(second["val_loss"].get<double>(), 5.25);
}

TEST_F(MetricsFile, EmptyPathWritesNothing) {
  jumbo::MetricsLog log("");
  log.write(sample_metrics());  // no file, no throw
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(MetricsFile, UnopenablePathIsAUserErrorNamingIt) {
  // A directory where the file should be: fails even for root, unlike a permission test.
  const fs::path path = dir_ / "is-a-directory";
  fs::create_directories(path);
  try {
    jumbo::MetricsLog log(path.string());
    FAIL() << "expected UserError";
  } catch (const jumbo::UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("log.metrics_file = " + path.string()), std::string::npos) << what;
    EXPECT_NE(what.find("cannot open for writing: Is a directory"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
  }
}

TEST_F(MetricsFile, ParentThatIsAFileIsAUserError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "plain-file") << "x";
  const fs::path path = dir_ / "plain-file" / "metrics.jsonl";
  EXPECT_THROW(jumbo::MetricsLog log(path.string()), jumbo::UserError);
}
