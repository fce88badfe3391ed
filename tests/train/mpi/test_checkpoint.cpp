// Checkpoints under mpirun on 8 ranks: a run saved with (tp 2, pp 2, dp 2) at step 5 and
// resumed with the same layout repeats the uninterrupted run's steps 6-10 bit for bit; resumed
// with (1,4,2) and (4,1,2), ZeRO-1 toggled, it stays within the layout tests' tolerances
// (losses 1e-5 relative, weights 1e-4 absolute of the one-rank run).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/ckpt/manifest.h"
#include "jumbo/train/reshard.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

// The learning rate decays over the whole run's tokens; a run stopped early must follow the
// 10-step run's schedule to be its first half.
RunConfig saving_config(int tp, int pp, bool zero1, const std::string& dir, int64_t steps) {
  RunConfig cfg = test::layout_config(tp, pp, zero1, "fp32");
  cfg.train.decay_tokens = cfg.train.steps * cfg.train.global_batch * cfg.model.context;
  cfg.train.steps = steps;
  cfg.checkpoint.dir = dir;
  cfg.checkpoint.every = 5;
  return cfg;
}

RunConfig resuming_config(int tp, int pp, bool zero1, const std::string& dir) {
  RunConfig cfg = test::layout_config(tp, pp, zero1, "fp32");
  cfg.checkpoint.dir = dir;
  cfg.checkpoint.resume = "auto";
  return cfg;
}

bool eight_ranks() { return mpi_world()->size() == 8; }

// Saved once (asynchronously, ZeRO-1 on) by the first test that needs it.
const std::string& saved_at_step_5() {
  static const std::string dir = [] {
    const std::string d = test::fresh_checkpoint_dir("resume-222");
    RunConfig cfg = saving_config(2, 2, true, d, 5);
    cfg.checkpoint.async = true;
    auto backend = make_cpu_backend();
    Trainer t(cfg, *backend, mpi_world());
    t.run();
    return d;
  }();
  return dir;
}

TEST(Checkpoint, SameLayoutResumeIsBitIdentical) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  auto w = mpi_world();
  // The uninterrupted run, with the same layout.
  auto backend = make_cpu_backend();
  std::vector<double> full;
  std::vector<float> full_weights;
  {
    Trainer t(test::layout_config(2, 2, true, "fp32"), *backend, w);
    full = t.run().losses;
    Tensor m = t.model().params().all_weights();
    full_weights.assign(m.as<float>(), m.as<float>() + m.numel());
  }
  const std::string dir = saved_at_step_5();
  w->barrier();  // rank 0 writes the manifest last
  EXPECT_TRUE(fs::exists(fs::path(dir) / "step_00000005" / "manifest.json"));
  Trainer t(resuming_config(2, 2, true, dir), *backend, w);
  const TrainSummary s = t.run();
  ASSERT_EQ(s.first_step, 6);
  ASSERT_EQ(s.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(s.losses[i], full[5 + i]) << "step " << 6 + i << " differs after the resume";
  }
  Tensor m = t.model().params().all_weights();
  ASSERT_EQ(static_cast<size_t>(m.numel()), full_weights.size());
  EXPECT_EQ(std::memcmp(m.data, full_weights.data(), m.bytes()), 0)
      << "final weights differ from the uninterrupted run";
}

class ResumeLayouts : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(ResumeLayouts, MatchTheUninterruptedRun) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  const auto [tp, pp, zero1] = GetParam();
  static const test::RefRun ref = test::reference("fp32");
  const std::string dir = saved_at_step_5();
  auto backend = make_cpu_backend();
  Trainer t(resuming_config(tp, pp, zero1, dir), *backend, mpi_world());
  const TrainSummary s = t.run();
  ASSERT_EQ(s.first_step, 6);
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_NEAR(s.losses[i], ref.losses[5 + i], 1e-5 * ref.losses[5 + i])
        << "step " << 6 + i << " tp " << tp << " pp " << pp << " zero1 " << zero1;
  }
  test::expect_same_weights(t, ref.reference_weights, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(OtherLayouts, ResumeLayouts,
                         ::testing::Values(std::make_tuple(1, 4, false), std::make_tuple(1, 4, true),
                                           std::make_tuple(4, 1, true), std::make_tuple(4, 1, false),
                                           std::make_tuple(8, 1, false)));

// Offline conversion to (4, 1, 2) gives the state a (4, 1, 2) run loads from the original:
// resuming from either repeats the same losses and weights bit for bit.
TEST(Checkpoint, ConvertedCheckpointLoadsLikeTheOriginal) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  auto w = mpi_world();
  const std::string original = saved_at_step_5();
  const std::string converted = test::fresh_checkpoint_dir("converted-412");
  Layout target;
  target.tp = 4;
  target.dp = 2;
  target.zero1 = true;
  target.bucket_size = 3000;  // several buckets: ZeRO-1 cuts tensors into element ranges
  reshard_checkpoint(original, converted, target, *w, {});
  if (w->rank() == 0) {
    std::ifstream f(fs::path(converted) / "step_00000005" / "manifest.json");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const Manifest m = parse_manifest(text, "converted");
    EXPECT_EQ(m.layout.tp, 4);
    EXPECT_EQ(m.layout.dp, 2);
    EXPECT_EQ(m.files.size(), 8u);
    EXPECT_EQ(m.progress.step, 5);
  }
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> weights;
  for (const std::string& dir : {original, converted}) {
    auto backend = make_cpu_backend();
    Trainer t(resuming_config(4, 1, false, dir), *backend, w);
    losses.push_back(t.run().losses);
    Tensor m = t.model().params().all_weights();
    weights.emplace_back(m.as<float>(), m.as<float>() + m.numel());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(weights[0], weights[1]);
}

// model.vocab = 500 is padded to 512 with tp 2 and to 1024 with tp 8: a checkpoint saved with
// one padding loads into the other (the padded rows are never used).
TEST(Checkpoint, ResumesAcrossVocabularyPadding) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  RunConfig one = test::layout_config(1, 1, false, "fp32");
  one.model.vocab = 500;
  const std::vector<double> ref = test::solo_run(one).losses;
  const std::string dir = test::fresh_checkpoint_dir("vocab-500");
  auto backend = make_cpu_backend();
  {
    RunConfig save = saving_config(2, 2, true, dir, 5);
    save.model.vocab = 500;
    Trainer(save, *backend, mpi_world()).run();
  }
  RunConfig cfg = resuming_config(8, 1, false, dir);
  cfg.model.vocab = 500;
  Trainer t(cfg, *backend, mpi_world());
  EXPECT_EQ(t.model().padded_vocab(), 1024);
  const TrainSummary s = t.run();
  ASSERT_EQ(s.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(s.losses[i], ref[5 + i], 1e-5 * ref[5 + i]);
}

// Retention: keep the newest 2 and every 4th step for good; a sync save each 2 steps.
TEST(Checkpoint, RetentionKeepsTheLastNAndEveryKth) {
  if (!eight_ranks()) GTEST_SKIP() << "needs 8 ranks";
  const std::string dir = test::fresh_checkpoint_dir("retention");
  RunConfig cfg = saving_config(2, 2, false, dir, 10);
  cfg.checkpoint.every = 2;
  cfg.checkpoint.keep_last = 2;
  cfg.checkpoint.keep_every = 4;
  auto backend = make_cpu_backend();
  Trainer(cfg, *backend, mpi_world()).run();
  mpi_world()->barrier();
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  // last_save.json: the newest save's bytes and seconds (docs/checkpoint-format.md).
  EXPECT_EQ(left, (std::vector<std::string>{"last_save.json", "latest", "step_00000004",
                                            "step_00000008", "step_00000010"}));
}

}  // namespace
}  // namespace jumbo
