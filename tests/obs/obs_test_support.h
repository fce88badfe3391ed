#pragma once
// Shared by the obs tests: one step's metrics with every field set, and a scratch
// directory per test under the build tree.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "jumbo/obs/metrics.h"

namespace jumbo::testing {

inline StepMetrics sample_metrics() {
  StepMetrics m;
  m.step = 12;
  m.total_steps = 200;
  m.loss = 5.1234;
  m.lr = 3e-4;
  m.grad_norm = 0.85;
  m.global_batch = 32;
  m.tokens = 12 * 32 * 256;
  m.tokens_per_s = 12345.0;
  m.tflops_per_device = 0.1034;
  m.mfu = 0.512;
  m.step_time_s = 0.6636;
  m.mem_peak_bytes = uint64_t(1288490189);  // 1.2 GiB
  m.eta_s = 192.0;
  return m;
}

// dir_: build/test-scratch/obs/<test>-<pid>, empty and not created (a test may check that
// a writer creates it), removed afterwards.
class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(JUMBO_BINARY_DIR) / "test-scratch" / "obs" /
           (std::string(info->name()) + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

}  // namespace jumbo::testing
