// The layout matrix under comm.emulate = nccl: MPI held to NCCL's rules (synchronous sends,
// tags ignored, groups posted and completed together, one communicator's operations in issue
// order). Every pipeline schedule (1F1B, interleaved, forward-only evaluation) and every kind
// of group (tp with and without sequence parallelism, dp's overlapped buckets, ZeRO-1's
// overlapped weight gather) trains, evaluates and resumes exactly as under MPI: the same
// losses, validation loss and weights bit for bit, and the one-rank run's losses within the
// layout tests' 1e-5. On 2 and 8 ranks; 6 ranks repeat what these cover.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "layout_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/train/trainer.h"

namespace jumbo {
namespace {

struct Case {
  int ranks, tp, pp, virtual_stages;
  bool zero1, sequence_parallel;
  const char* recompute;
  bool resume = false;  // also saved at step 2 and resumed under NCCL's rules
};

std::string name(const Case& c) {
  return "tp " + std::to_string(c.tp) + " pp " + std::to_string(c.pp) + " v " +
         std::to_string(c.virtual_stages) + (c.zero1 ? " zero1" : "") +
         (c.sequence_parallel ? " sp" : "") + " recompute " + c.recompute;
}

constexpr int64_t kSteps = 4;

// The layout tests' run, shortened to four steps on the 10-step run's schedule (so its losses
// are the reference's first four), with an evaluation every two steps.
RunConfig case_config(const Case& c, const std::string& checkpoint_dir = "") {
  RunConfig cfg = test::layout_config(c.tp, c.pp, c.zero1, "fp32", c.recompute,
                                      c.sequence_parallel);
  cfg.parallel.virtual_stages = c.virtual_stages;
  cfg.train.decay_tokens = cfg.train.steps * cfg.train.global_batch * cfg.model.context;
  cfg.train.steps = kSteps;
  cfg.train.eval_every = 2;
  cfg.train.eval_batches = 8;
  cfg.data.valid = parse_mixture(test::data_dir() + "/train2");
  cfg.checkpoint.dir = checkpoint_dir;
  return cfg;
}

struct Outcome {
  std::vector<double> losses;
  std::optional<double> val_loss;
  std::vector<float> weights;  // this rank's
  int64_t first_step = 0;
};

Outcome train(const RunConfig& cfg, std::shared_ptr<Comm> world) {
  auto backend = make_cpu_backend();
  Trainer t(cfg, *backend, std::move(world));
  const TrainSummary s = t.run();
  Tensor w = t.model().params().all_weights();
  return {s.losses, s.final_val_loss, {w.as<float>(), w.as<float>() + w.numel()}, s.first_step};
}

void expect_identical(const Outcome& nccl, const Outcome& mpi, const std::string& what) {
  ASSERT_EQ(nccl.losses.size(), mpi.losses.size()) << what;
  for (size_t i = 0; i < mpi.losses.size(); ++i) {
    EXPECT_EQ(nccl.losses[i], mpi.losses[i]) << what << ": step " << i + 1;
  }
  EXPECT_EQ(nccl.val_loss, mpi.val_loss) << what << ": validation loss";
  ASSERT_EQ(nccl.weights.size(), mpi.weights.size()) << what;
  EXPECT_EQ(std::memcmp(nccl.weights.data(), mpi.weights.data(), 4 * mpi.weights.size()), 0)
      << what << ": weights differ";
}

// Saved at step 2 and resumed under NCCL's rules: the uninterrupted run's steps 3 and 4, its
// validation loss and weights bit for bit.
void expect_resume_identical(const Case& c, const Outcome& whole, std::shared_ptr<Comm> world) {
  const std::string dir = test::fresh_checkpoint_dir("nccl-rules-resume");
  RunConfig first = case_config(c, dir);
  first.train.steps = 2;
  first.checkpoint.every = 2;
  train(first, make_nccl_rules_comm(world));
  RunConfig rest = case_config(c, dir);
  rest.checkpoint.resume = "auto";
  Outcome resumed = train(rest, make_nccl_rules_comm(world));
  ASSERT_EQ(resumed.first_step, 3) << name(c);
  Outcome tail = whole;
  tail.losses.erase(tail.losses.begin(), tail.losses.begin() + 2);
  expect_identical(resumed, tail, name(c) + ", resumed at step 2");
}

class NcclRulesLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(NcclRulesLayouts, TrainEvaluateAndResumeAsUnderMpi) {
  const Case c = GetParam();
  auto world = mpi_world();
  if (world->size() != c.ranks) GTEST_SKIP() << "runs on " << c.ranks << " ranks";
  static const test::RefRun ref = test::reference("fp32");
  const Outcome mpi = train(case_config(c), world);
  const Outcome nccl = train(case_config(c), make_nccl_rules_comm(world));
  expect_identical(nccl, mpi, name(c));
  ASSERT_TRUE(nccl.val_loss.has_value()) << name(c) << ": no evaluation ran";
  for (size_t i = 0; i < nccl.losses.size(); ++i) {
    EXPECT_NEAR(nccl.losses[i], ref.losses[i], 1e-5 * ref.losses[i])
        << name(c) << ": step " << i + 1;
  }
  if (c.resume) expect_resume_identical(c, nccl, world);
}

// The pipeline schedules on the groups that change what a pipeline exchange meets: 1F1B and
// interleaved on pp 2 alone; with tp (sequence parallelism, recomputation), dp, ZeRO-1 and
// pp 4 on 8 ranks; resumed on both.
INSTANTIATE_TEST_SUITE_P(
    EverySchedule, NcclRulesLayouts,
    ::testing::Values(Case{2, 1, 2, 1, false, false, "none"},
                      Case{2, 1, 2, 2, false, false, "selective", true},
                      Case{2, 2, 1, 1, false, true, "none"},
                      Case{2, 1, 1, 1, true, false, "none"},
                      Case{8, 2, 2, 2, true, true, "none", true},
                      Case{8, 1, 4, 2, true, false, "full"},
                      Case{8, 2, 4, 1, false, true, "selective"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "np" + std::to_string(c.ranks) + "_tp" + std::to_string(c.tp) + "_pp" +
             std::to_string(c.pp) + "_v" + std::to_string(c.virtual_stages) +
             (c.zero1 ? "_zero1" : "") + (c.sequence_parallel ? "_sp" : "");
    });

}  // namespace
}  // namespace jumbo
