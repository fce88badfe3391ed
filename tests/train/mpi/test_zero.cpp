// The distributed optimizer (ZeRO-1 with the fp32 master sharded) under mpirun, in bf16:
// each rank's optimizer holds 12/dp bytes per parameter of its stage (the master and Adam's
// two moments), ZeRO-1 on and off train the same model, and a resume repeats the
// uninterrupted run bit for bit, with checkpoints loading across ZeRO-1 on and off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

// The (tp, pp) layouts of the issue whose dp = world / (tp pp) is 2 or 4 on this world.
std::vector<std::pair<int, int>> layouts_with_small_dp() {
  const int n = mpi_world()->size();
  std::vector<std::pair<int, int>> out;
  for (auto [tp, pp] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{1, 1}}) {
    const int dp = n % (tp * pp) == 0 ? n / (tp * pp) : 0;
    if (dp == 2 || dp == 4) out.emplace_back(tp, pp);
  }
  return out;
}

TEST(ShardedMaster, OptimizerHolds12OverDpBytesPerParameter) {
  const auto layouts = layouts_with_small_dp();
  if (layouts.empty()) GTEST_SKIP() << "no layout with dp 2 or 4 on this world";
  auto backend = make_cpu_backend();
  for (auto [tp, pp] : layouts) {
    for (bool zero1 : {true, false}) {
      RunConfig cfg = test::layout_config(tp, pp, zero1, "bf16");
      Trainer t(cfg, *backend, mpi_world());
      const double n = static_cast<double>(t.model().params().total_numel());
      const double dp = static_cast<double>(t.grid().dp_size());
      const double want_optimizer = 12 * n / (zero1 ? dp : 1);
      const double got_optimizer = static_cast<double>(t.optimizer().state_bytes());
      EXPECT_NEAR(got_optimizer, want_optimizer, 0.05 * want_optimizer)
          << "master + Adam bytes, tp " << tp << " pp " << pp << " dp " << dp << " zero1 "
          << zero1 << " rank " << mpi_world()->rank();
      // bf16 weights and f32 grads, whole on every rank.
      const double got_params = static_cast<double>(t.model().params().bytes());
      EXPECT_NEAR(got_params, 6 * n, 0.05 * 6 * n) << "weights + grads, tp " << tp << " pp " << pp;
    }
  }
}

std::vector<float> owned_master(const Trainer& t) {
  const Tensor m = t.optimizer().master();
  return {m.as<float>(), m.as<float>() + m.numel()};
}

// ZeRO-1 off reduces each bucket with the same ring as ZeRO-1's reduce-scatter (then gathers
// the sums), so the updates agree; only the grad norm's summation order differs.
TEST(ShardedMaster, Zero1OnAndOffTrainTheSameModel) {
  const auto layouts = layouts_with_small_dp();
  if (layouts.empty()) GTEST_SKIP() << "no layout with dp 2 or 4 on this world";
  const auto [tp, pp] = layouts.front();
  auto backend = make_cpu_backend();
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> masters;
  std::vector<OptimRange> sharded_ranges;
  for (bool zero1 : {false, true}) {
    Trainer t(test::layout_config(tp, pp, zero1, "bf16"), *backend, mpi_world());
    losses.push_back(t.run().losses);
    masters.push_back(owned_master(t));
    if (zero1) sharded_ranges = t.optimizer().ranges();
  }
  ASSERT_EQ(losses[0].size(), 10u);
  for (size_t i = 0; i < losses[0].size(); ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << "step " << i + 1;
  }
  // The sharded master's ranges against the same elements of the whole one.
  double worst = 0;
  for (const OptimRange& r : sharded_ranges) {
    for (int64_t k = 0; k < r.count; ++k) {
      worst = std::max(worst, std::abs(double(masters[1][r.local + k]) - masters[0][r.flat + k]));
    }
  }
  EXPECT_LT(worst, 1e-5) << "largest master difference, ZeRO-1 on vs off";
}

RunConfig bf16_run(int tp, int pp, bool zero1, const std::string& dir) {
  RunConfig cfg = test::layout_config(tp, pp, zero1, "bf16");
  cfg.checkpoint.dir = dir;
  cfg.checkpoint.every = 5;
  cfg.checkpoint.resume = "auto";
  return cfg;
}

// Saved at step 5 with ZeRO-1 `zero1` (a run stopped there), resumed with `resume_zero1`.
std::vector<double> resumed_losses(int tp, int pp, bool zero1, bool resume_zero1,
                                   const std::string& name, std::vector<float>* master) {
  const std::string dir = test::fresh_checkpoint_dir(name);
  auto backend = make_cpu_backend();
  {
    RunConfig cfg = bf16_run(tp, pp, zero1, dir);
    cfg.train.decay_tokens = cfg.train.steps * cfg.train.global_batch * cfg.model.context;
    cfg.train.steps = 5;
    Trainer t(cfg, *backend, mpi_world());
    t.run();
  }
  Trainer t(bf16_run(tp, pp, resume_zero1, dir), *backend, mpi_world());
  const TrainSummary s = t.run();
  EXPECT_EQ(s.first_step, 6);
  if (master) *master = owned_master(t);
  return s.losses;
}

TEST(ShardedMaster, ResumeIsBitIdenticalAndLoadsAcrossZero1) {
  const auto layouts = layouts_with_small_dp();
  if (layouts.empty()) GTEST_SKIP() << "no layout with dp 2 or 4 on this world";
  const auto [tp, pp] = layouts.front();
  auto backend = make_cpu_backend();
  std::vector<double> full;
  std::vector<float> full_master;
  {
    Trainer t(test::layout_config(tp, pp, true, "bf16"), *backend, mpi_world());
    full = t.run().losses;
    full_master = owned_master(t);
  }
  std::vector<float> master;
  const std::vector<double> same = resumed_losses(tp, pp, true, true, "zero-same", &master);
  ASSERT_EQ(same.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(same[i], full[5 + i]) << "step " << 6 + i;
  EXPECT_EQ(master, full_master) << "the sharded master after the resume differs";
  // Sharded master saved, loaded whole; and whole saved, loaded sharded.
  for (bool saved_zero1 : {true, false}) {
    const std::vector<double> across = resumed_losses(
        tp, pp, saved_zero1, !saved_zero1, saved_zero1 ? "zero-to-whole" : "whole-to-zero", nullptr);
    ASSERT_EQ(across.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(across[i], full[5 + i], 1e-5 * full[5 + i])
          << "step " << 6 + i << ", saved with ZeRO-1 " << saved_zero1;
    }
  }
}

}  // namespace
}  // namespace jumbo
