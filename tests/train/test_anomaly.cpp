// Anomalous steps on one rank (train.on_anomaly): the guard's rule, the test faults, and whole
// runs that skip or rewind around an injected fault and resume from before and after it bit
// for bit, with the same skipped samples.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../data/data_test_support.h"
#include "jumbo/train/anomaly.h"
#include "jumbo/train/fault_injection.h"
#include "train_test_support.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

TEST(AnomalyGuard, SpikeIsALossAboveTheRatioOfTheRunningMeanOnceTheWindowFilled) {
  TrainConfig t;
  t.spike_ratio = 1.5;
  t.spike_window = 3;  // alpha = 2 / (3 + 1)
  AnomalyGuard g(t);
  EXPECT_FALSE(g.check(100, 1).kind);  // nothing to compare with yet
  g.accept(4);
  g.accept(4);
  EXPECT_FALSE(g.check(100, 1).kind);  // two of three steps
  g.accept(4);
  const AnomalyVerdict spike = g.check(6.01, 1);
  ASSERT_TRUE(spike.kind);
  EXPECT_EQ(*spike.kind, AnomalyKind::spike);
  EXPECT_DOUBLE_EQ(spike.running_mean, 4);
  EXPECT_DOUBLE_EQ(spike.threshold, 6);
  EXPECT_FALSE(g.check(5.99, 1).kind);
  EXPECT_EQ(*g.check(NAN, 1).kind, AnomalyKind::nonfinite);
  EXPECT_EQ(*g.check(4, INFINITY).kind, AnomalyKind::nonfinite);
  g.accept(8);  // 4 + 0.5 x (8 - 4)
  EXPECT_DOUBLE_EQ(g.progress().loss_mean, 6);
  t.spike_ratio = 0;  // no spike detection; non-finite steps are still anomalies
  AnomalyGuard off(t);
  for (int i = 0; i < 5; ++i) off.accept(1);
  EXPECT_FALSE(off.check(1000, 1).kind);
  EXPECT_TRUE(off.check(NAN, 1).kind);
}

TEST(AnomalyGuard, LimitCountsTheAnomaliesOfTheWindow) {
  TrainConfig t;
  t.max_anomalies = 2;
  t.anomaly_window = 10;
  AnomalyGuard g(t);
  EXPECT_EQ(g.record({.step = 5}), 1);
  EXPECT_EQ(g.record({.step = 12}), 2);
  const int64_t third = g.record({.step = 14});
  EXPECT_EQ(third, 3);
  EXPECT_TRUE(g.over_limit(third));
  EXPECT_EQ(g.record({.step = 30}), 1);  // the others are more than 10 steps back
  EXPECT_EQ(g.record({.step = 25}), 2);  // after a rewind: step 30's anomaly is recent too
  EXPECT_EQ(g.progress().skipped.size(), 5u);
}

TEST(FaultInjection, ParsesTheFaultsAndRefusesMalformedOnes) {
  const FaultInjection f = FaultInjection::parse("nan@100,spike@187,slow@3:250");
  EXPECT_TRUE(f.nan_in(96, 104));
  EXPECT_FALSE(f.nan_in(104, 112));
  EXPECT_TRUE(f.spike_in(184, 192));
  EXPECT_EQ(f.slow_ms(3), 250);
  EXPECT_EQ(f.slow_ms(2), 0);
  EXPECT_TRUE(FaultInjection::parse("").empty());
  for (const char* bad : {"nan", "nan@x", "spike@-1", "slow@3", "slow@a:5", "boom@1"}) {
    const std::string msg = test::user_error_of([&] { FaultInjection::parse(bad); });
    EXPECT_NE(msg.find("JUMBO_TEST_FAULT"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  }
}

// JUMBO_TEST_FAULT for the lifetime of the object.
struct FaultScope {
  explicit FaultScope(const char* faults) { setenv("JUMBO_TEST_FAULT", faults, 1); }
  ~FaultScope() { unsetenv("JUMBO_TEST_FAULT"); }
};

// The tiny run of 40 steps of 8 samples, saving every 10 into DIR/name.
RunConfig anomaly_config(TinyRun& run, const std::string& name, const std::string& action,
                         std::vector<std::string> more = {}) {
  std::vector<std::string> sets = {"train.on_anomaly=" + action, "train.spike_window=5",
                                   "train.spike_ratio=1.3", "train.eval_every=0",
                                   "checkpoint.dir=" + run.dir.file(name), "checkpoint.every=10"};
  sets.insert(sets.end(), more.begin(), more.end());
  return load_run_config(run.config(), sets);
}

// Starts a run in DIR/name from a copy of `from`'s checkpoint of `step` alone.
RunConfig resumed_from(TinyRun& run, const RunConfig& from, int64_t step, const std::string& name,
                       const std::string& action) {
  const fs::path dir = run.dir.file(name);
  fs::create_directories(dir);
  fs::copy(fs::path(from.checkpoint.dir) / checkpoint_dir_name(step), dir / checkpoint_dir_name(step),
           fs::copy_options::recursive);
  RunConfig cfg = anomaly_config(run, name, action);
  cfg.checkpoint.resume = "auto";
  return cfg;
}

void expect_same_tail(const TrainSummary& resumed, const TrainSummary& whole) {
  ASSERT_EQ(resumed.steps, whole.steps);
  const size_t first = static_cast<size_t>(resumed.first_step - 1);
  ASSERT_EQ(resumed.losses.size(), whole.losses.size() - first);
  for (size_t i = 0; i < resumed.losses.size(); ++i) {
    EXPECT_EQ(resumed.losses[i], whole.losses[first + i]) << "step " << first + i + 1;
  }
  EXPECT_EQ(resumed.anomalies, whole.anomalies);
}

TEST(Anomalies, SkipLeavesOutTheUpdateAndResumesBitIdentical) {
  TinyRun run;
  const TrainSummary clean = train(anomaly_config(run, "clean", "skip"));
  EXPECT_TRUE(clean.anomalies.empty());
  const FaultScope fault("nan@100");  // step 13: samples 96-103
  const RunConfig cfg = anomaly_config(run, "skip", "skip");
  const TrainSummary s = train(cfg);
  ASSERT_EQ(s.steps, 40);
  ASSERT_EQ(s.anomalies.size(), 1u);
  const SkippedSamples& a = s.anomalies[0];
  EXPECT_EQ(a.step, 13);
  EXPECT_EQ(a.first_sample, 96);
  EXPECT_EQ(a.end_sample, 104);
  EXPECT_EQ(a.kind, AnomalyKind::nonfinite);
  EXPECT_EQ(a.action, AnomalyAction::skip);
  // The same model through step 13's forward; without its update, step 14 differs.
  for (int i = 0; i < 13; ++i) EXPECT_EQ(s.losses[i], clean.losses[i]) << "step " << i + 1;
  EXPECT_NE(s.losses[13], clean.losses[13]);
  std::printf("skip: final loss %.6f, skipped samples [%lld, %lld) at step %lld\n", s.final_loss,
              static_cast<long long>(a.first_sample), static_cast<long long>(a.end_sample),
              static_cast<long long>(a.step));
  // The step's metrics line says what was seen and done.
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  std::string line, anomalous;
  while (std::getline(metrics, line))
    if (line.find("\"anomaly\"") != std::string::npos) anomalous = line;
  EXPECT_NE(anomalous.find("\"step\":13,"), std::string::npos) << anomalous;
  EXPECT_NE(anomalous.find("\"kind\":\"nonfinite\",\"action\":\"skip\""), std::string::npos) << anomalous;
  EXPECT_NE(anomalous.find("\"skipped_samples\":[96,104]"), std::string::npos) << anomalous;

  expect_same_tail(train(resumed_from(run, cfg, 10, "skip-from-10", "skip")), s);
  expect_same_tail(train(resumed_from(run, cfg, 20, "skip-from-20", "skip")), s);
}

TEST(Anomalies, RewindGoesBackToTheCheckpointSkipsTheBatchesSinceAndResumesBitIdentical) {
  TinyRun run;
  const FaultScope fault("spike@187");  // step 24: samples 184-191, targets scrambled
  const RunConfig cfg = anomaly_config(run, "rewind", "rewind");
  const TrainSummary s = train(cfg);
  ASSERT_EQ(s.steps, 40);
  ASSERT_EQ(s.losses.size(), 40u);  // steps 21-23 ran twice; the second time counts
  ASSERT_EQ(s.anomalies.size(), 1u);
  const SkippedSamples& a = s.anomalies[0];
  EXPECT_EQ(a.step, 24);
  EXPECT_EQ(a.kind, AnomalyKind::spike);
  EXPECT_EQ(a.action, AnomalyAction::rewind);
  EXPECT_EQ(a.rewound_to_step, 20);
  EXPECT_EQ(a.first_sample, 160);  // from the checkpoint's place through step 24's batch
  EXPECT_EQ(a.end_sample, 192);
  EXPECT_GT(a.loss, 1.3 * s.losses[19]);
  std::printf("rewind: final loss %.6f, skipped samples [%lld, %lld), rewound from step %lld "
              "to %lld\n", s.final_loss, static_cast<long long>(a.first_sample),
              static_cast<long long>(a.end_sample), static_cast<long long>(a.step),
              static_cast<long long>(a.rewound_to_step));
  // Before the anomaly: the resumed run meets it and rewinds as the whole run did.
  expect_same_tail(train(resumed_from(run, cfg, 10, "rewind-from-10", "rewind")), s);
  expect_same_tail(train(resumed_from(run, cfg, 30, "rewind-from-30", "rewind")), s);
}

TEST(Anomalies, RepeatedAnomaliesEndTheRunAtTheLimitWithOneLine) {
  TinyRun run;
  const FaultScope fault("spike@187");
  // Two batches skipped from step 20: step 22 meets the same bad samples, again and again.
  const RunConfig cfg = anomaly_config(run, "limit", "rewind",
                                       {"train.rewind_skip_batches=2", "train.max_anomalies=2"});
  const std::string msg = test::user_error_of([&] { train(cfg); });
  EXPECT_NE(msg.find("step 22: 3 anomalies within train.anomaly_window = 1000 steps, more than "
                     "train.max_anomalies = 2"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Anomalies, StopEndsTheRunBeforeTheUpdateAndNamesTheSpike) {
  TinyRun run;
  const FaultScope fault("spike@187");
  const std::string msg = test::user_error_of([&] { train(anomaly_config(run, "stop", "stop")); });
  EXPECT_NE(msg.find("step 24: loss"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is a spike; stopping before the update"), std::string::npos) << msg;
}

TEST(Anomalies, RewindWithoutAnEarlierCheckpointSkipsAndSaysSo) {
  TinyRun run;
  const FaultScope fault("nan@20");  // step 3, before the first save
  const TrainSummary s = train(anomaly_config(run, "early", "rewind", {"train.steps=12"}));
  ASSERT_EQ(s.anomalies.size(), 1u);
  EXPECT_EQ(s.anomalies[0].action, AnomalyAction::skip);
  EXPECT_EQ(s.anomalies[0].first_sample, 16);
  EXPECT_EQ(s.steps, 12);
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  std::string line, anomalous;
  while (std::getline(metrics, line))
    if (line.find("\"anomaly\"") != std::string::npos) anomalous = line;
  EXPECT_NE(anomalous.find("\"action\":\"skip\",\"requested\":\"rewind\""), std::string::npos)
      << anomalous;
}

TEST(Anomalies, ASkippedStepStillEvaluatesWhenDue) {
  TinyRun run;
  const FaultScope fault("nan@90");  // step 12, the last: samples 88-95
  const TrainSummary s =
      train(anomaly_config(run, "eval", "skip", {"train.steps=12", "train.eval_every=6"}));
  ASSERT_EQ(s.anomalies.size(), 1u);
  EXPECT_EQ(s.anomalies[0].step, 12);
  ASSERT_TRUE(s.final_val_loss.has_value());
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  EXPECT_NE(last.find("\"val_loss\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"anomaly\""), std::string::npos) << last;
}

}  // namespace
}  // namespace jumbo
