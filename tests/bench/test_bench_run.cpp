// `jumbo bench train --config` (train/bench.h): the plan's estimate it prints is the plan's
// own number for the layout, and its last line is the machine-readable one slurm/preflight.sh
// and the time-model fit read. (Its run on MPI ranks: tests/slurm/preflight.sh, slurm.multihost.)
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "jumbo/config/gpus.h"
#include "jumbo/plan/search.h"
#include "jumbo/bench/bench.h"

namespace jumbo {
namespace {

// The shipped run config names its preset relative to the checkout, as jumbo's users run it.
class BenchRun : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = std::filesystem::current_path();
    std::filesystem::current_path(JUMBO_SOURCE_DIR);
  }
  void TearDown() override { std::filesystem::current_path(saved_); }
  std::filesystem::path saved_;
};

// J1-Jumbo on 64 p4d nodes: the layout `jumbo plan --config ... --best` recommends, put into
// the run config (what slurm/preflight.sh passes as --set), gets from planned_step exactly the
// step time the plan ranked it by.
TEST_F(BenchRun, PlannedStepIsThePlansEstimateOfItsRecommendedLayout) {
  RunConfig cfg = load_run_config("inputs/runs/j1-jumbo.toml", {});
  const GpuSpec& gpu = *find_gpu("a100-40gb");
  // The request as src/cli/verb_plan.cpp builds it for --config: model, global batch and
  // precision of the config, --nodes 64 --gpus-per-node 8, the GPU target.
  PlanRequest r;
  r.model = cfg.model;
  r.target.global_batch = cfg.train.global_batch;
  r.target.precision = cfg.train.precision;
  r.target.device = PlanDevice::gpu;
  r.set_gpu(gpu, 8);
  r.nodes = 64;
  const std::vector<PlanCandidate> fitting = search_layouts(r);
  const PlanCandidate* best = recommended_layout(fitting);
  ASSERT_NE(best, nullptr);
  const Device device = cfg.parallel.device;
  static_cast<Layout&>(cfg.parallel) = best->layout;
  cfg.parallel.device = device;
  const RunConfig run = validated_for_world(cfg, 512);
  const PlanCandidate mine = planned_step(run, gpu, 64, 8);
  EXPECT_DOUBLE_EQ(mine.step_time_s, best->step_time_s);
  EXPECT_DOUBLE_EQ(mine.mfu, best->mfu);
  EXPECT_EQ(layout_token(run.parallel), layout_token(best->layout));
}

TEST_F(BenchRun, TheLastLineIsMachineReadableWithTheRatioOnAGpuAndNaOnTheCpu) {
  RunConfig cfg = load_run_config("inputs/runs/j1-jumbo.toml", {});
  RunBenchResult r;
  r.layout = validated_for_world(cfg, 512).parallel;
  r.world = 512;
  r.step_time_s = 30.0;
  r.step_times_s = {31.0, 30.0, 29.5};
  r.device = Device::cuda;
  r.has_plan = true;
  r.plan_step_time_s = 24.0;
  r.gpu = "a100-40gb";
  const RunBenchOptions o;
  std::string out = describe(r, cfg, o);
  std::string last = out.substr(out.rfind('\n') + 1);
  EXPECT_EQ(last, "preflight: step measured=30.0000s plan=24.0000s ratio=1.250 "
                  "layout=tp8,pp16,dp4,mb1,vs1,recompute=none,zero1=1,sp=1 device=cuda "
                  "gpu=a100-40gb ranks=512");

  r.device = Device::cpu;
  r.has_plan = false;
  out = describe(r, cfg, o);
  last = out.substr(out.rfind('\n') + 1);
  EXPECT_TRUE(std::regex_search(
      last, std::regex("^preflight: step measured=30\\.0000s plan=na ratio=na layout=tp8,pp16,"
                       "dp4,[^ ]+ device=cpu ranks=512 \\(a CPU run is estimated on a "
                       "measured machine: --machine FILE")))
      << last;
}

}  // namespace
}  // namespace jumbo
