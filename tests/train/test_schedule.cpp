#include <gtest/gtest.h>

#include <cmath>

#include "jumbo/train/schedule.h"

namespace jumbo {
namespace {

TrainConfig schedule_config() {
  TrainConfig t;
  t.lr = 6e-4;
  t.min_lr = 6e-5;
  t.warmup_tokens = 1000;
  t.global_batch = 64;
  return t;
}

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToTheMinimum) {
  const LrSchedule s(schedule_config(), 11000);
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(500), 3e-4);
  EXPECT_DOUBLE_EQ(s.at(1000), 6e-4);
  // Halfway through the cosine: the mean of peak and minimum.
  EXPECT_NEAR(s.at(6000), (6e-4 + 6e-5) / 2, 1e-12);
  EXPECT_NEAR(s.at(11000), 6e-5, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(50000), 6e-5);
  for (int64_t t = 1000; t < 11000; t += 250) EXPECT_GE(s.at(t), s.at(t + 250)) << t;
}

TEST(BatchRamp, GrowsInMicrobatchRoundsOverTheRampTokens) {
  TrainConfig t = schedule_config();
  t.rampup_start_batch = 16;
  t.rampup_tokens = 6000;  // (64 - 16) / 8 = 6 stages of 1000 tokens
  const BatchRamp r(t, 8);
  EXPECT_EQ(r.at(0), 16);
  EXPECT_EQ(r.at(999), 16);
  EXPECT_EQ(r.at(1000), 24);
  EXPECT_EQ(r.at(5999), 56);
  EXPECT_EQ(r.at(6000), 64);
  EXPECT_EQ(r.at(1 << 30), 64);
  for (int64_t k = 0; k < 7000; k += 100) EXPECT_EQ(r.at(k) % 8, 0);
}

TEST(BatchRamp, OffMeansTheGlobalBatchFromTheStart) {
  const BatchRamp r(schedule_config(), 8);
  EXPECT_EQ(r.at(0), 64);
}

TEST(Schedule, RunTokensFollowTheRamp) {
  RunConfig cfg;
  cfg.model.context = 10;
  cfg.parallel.micro_batch = 2;
  cfg.train = schedule_config();
  cfg.train.steps = 3;
  cfg.train.global_batch = 8;
  cfg.train.rampup_start_batch = 4;
  cfg.train.rampup_tokens = 80;  // 2 stages of 40 tokens: batches 4, 6, 8 (4x10, 6x10, ...)
  EXPECT_EQ(total_run_tokens(cfg, 1), 40 + 60 + 80);
}

}  // namespace
}  // namespace jumbo
