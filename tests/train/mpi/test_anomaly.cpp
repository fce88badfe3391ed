// Anomalous steps on a tp 2 x pp 2 x dp 2 layout with ZeRO-1 (8 ranks): an injected NaN in the
// gradients is skipped, or rewound to the newest checkpoint (each rank reloading its shards),
// with the same losses as the one-rank run and the same skipped samples; a run resumed from
// before the anomaly repeats the whole run's steps bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/ckpt/manifest.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

struct FaultScope {
  explicit FaultScope(const char* faults) { setenv("JUMBO_TEST_FAULT", faults, 1); }
  ~FaultScope() { unsetenv("JUMBO_TEST_FAULT"); }
};

// 10 steps of 24 samples; step k reads samples [24 (k - 1), 24 k).
RunConfig anomaly_config(int tp, int pp, AnomalyAction action, const std::string& dir) {
  RunConfig cfg = test::layout_config(tp, pp, tp * pp > 1, "fp32");
  cfg.train.on_anomaly = action;
  cfg.checkpoint.dir = dir;
  cfg.checkpoint.every = 3;
  return cfg;
}

TrainSummary run(const RunConfig& cfg) {
  auto backend = make_cpu_backend();
  Trainer t(cfg, *backend, mpi_world());
  return t.run();
}

void expect_losses_near(const TrainSummary& s, const std::vector<double>& ref) {
  ASSERT_EQ(s.losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(s.losses[i], ref[i], 1e-5 * ref[i]) << "step " << i + 1;
}

bool eight_ranks() { return mpi_world()->size() == 8; }

TEST(Anomalies, SkipOnTp2Pp2Dp2MatchesOneRank) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  const FaultScope fault("nan@101");  // step 5
  const test::RefRun ref = test::solo_run(
      anomaly_config(1, 1, AnomalyAction::skip, test::fresh_checkpoint_dir("anomaly-skip-solo")));
  const TrainSummary s =
      run(anomaly_config(2, 2, AnomalyAction::skip, test::fresh_checkpoint_dir("anomaly-skip-222")));
  expect_losses_near(s, ref.losses);
  ASSERT_EQ(s.anomalies.size(), 1u);
  EXPECT_EQ(s.anomalies[0], (SkippedSamples{.step = 5, .first_sample = 96, .end_sample = 120,
                                            .kind = AnomalyKind::nonfinite,
                                            .action = AnomalyAction::skip, .loss = s.losses[4]}));
}

TEST(Anomalies, RewindOnTp2Pp2Dp2MatchesOneRankAndResumesBitIdentical) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  const FaultScope fault("nan@146");  // step 7: back to step 6, samples 144-167 skipped
  const test::RefRun ref = test::solo_run(
      anomaly_config(1, 1, AnomalyAction::rewind, test::fresh_checkpoint_dir("anomaly-rewind-solo")));
  const RunConfig cfg =
      anomaly_config(2, 2, AnomalyAction::rewind, test::fresh_checkpoint_dir("anomaly-rewind-222"));
  const TrainSummary s = run(cfg);
  expect_losses_near(s, ref.losses);
  ASSERT_EQ(s.anomalies.size(), 1u);
  const SkippedSamples& a = s.anomalies[0];
  EXPECT_EQ(a.step, 7);
  EXPECT_EQ(a.rewound_to_step, 6);
  EXPECT_EQ(a.first_sample, 144);
  EXPECT_EQ(a.end_sample, 168);

  // From a copy of step 3's checkpoint alone: the resumed run saves step 6 itself and rewinds.
  const std::string dir = test::fresh_checkpoint_dir("anomaly-rewind-222-resumed");
  if (mpi_world()->rank() == 0) {
    fs::copy(fs::path(cfg.checkpoint.dir) / checkpoint_dir_name(3),
             fs::path(dir) / checkpoint_dir_name(3), fs::copy_options::recursive);
  }
  mpi_world()->barrier();
  RunConfig resumed = anomaly_config(2, 2, AnomalyAction::rewind, dir);
  resumed.checkpoint.resume = "auto";
  const TrainSummary r = run(resumed);
  ASSERT_EQ(r.first_step, 4);
  ASSERT_EQ(r.losses.size(), 7u);
  for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], s.losses[i + 3]) << "step " << i + 4;
  EXPECT_EQ(r.anomalies, s.anomalies);
}

}  // namespace
}  // namespace jumbo
